#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: writes tests/fixtures/tokenizer_ids.json, the reference ids that hgrn's BPE tokenizer
must reproduce, computed with the Hugging Face `tokenizers` package (pip install tokenizers).

For every (tokenizer.json, text file) pair in the shared data directory it records the number of ids, the SHA-256 of
the ids as little-endian int32 bytes and the first 200 ids. The text is encoded in the same pieces that the C++ test
uses: WikiText files one line at a time (each line with its trailing "\\n"), the Pile sample one record's "text" at a
time; the pieces' ids are concatenated. It also records the ids (and the decoded text) of a few hand-picked strings
that exercise the corners of the pipeline: NFC, added tokens inside text, whitespace runs, non-Latin scripts.

The shared files themselves stay outside the repository; only the small fixture is committed.

Usage: tools/make_tokenizer_fixtures.py [--data-dir DIR] [--out FILE]
"""
import argparse
import hashlib
import json
import os
import struct
import sys

import tokenizers

TOKENIZERS = ["tokenizers/gpt2/tokenizer.json", "tokenizers/gpt-neox-20b/20B_tokenizer.json"]

# (path relative to the data dir, how the file is cut into encode() calls)
TEXT_FILES = [
    ("wikitext-2/train.txt", "lines"),
    ("wikitext-2/valid.txt", "lines"),
    ("wikitext-2/test.txt", "lines"),
    ("wikitext-2-raw/wiki.valid.raw", "lines"),
    ("wikitext-2-raw/wiki.test.raw", "lines"),
    ("pile-sample/pile_text.jsonl", "jsonl_text"),
]

# Strings chosen to hit each stage: normaliser, added-token splitting, the GPT-2 regex's branches, byte mapping.
HAND_PICKED = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right, we've seen they'll say she'd do it's DON'T and I'LL",
    "cafe\u0301 na\u0131\u0308ve A\u030a \u212b e\u0301\u0301",  # combining accents that NFC composes
    "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m",  # the same letters precomposed
    # Hangul jamo that compose into a syllable, reordered marks, composition exclusions, singletons, a mark after
    # a precomposed letter and marks at the very start
    "\u0301\u0301start \u1100\u1161\u11a8 o\u0323\u0302 q\u0307\u0323 \u0958 \u212b\u2126"
    " \u00e9\u0301x\u00c5\u0328 end\u0327",
    "emoji: \U0001f600 \u2764\ufe0f \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1ef\U0001f1f5",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439"
    " \u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940",
    "first document<|endoftext|>second document",
    "<|endoftext|><|endoftext|> <|endoftext|> x<|endoftext|>",
    "<|endoftext <|padding|> |endoftext|>",
    "a  b   c    d     e",
    "x" + " " * 30 + "y" + " " * 24 + "z" + " " * 23 + "\n",
    "trailing spaces   ",
    "   leading spaces",
    "line one\nline two\n\n\nline three\r\nend\n",
    "\ttab\t\tindented\n    four spaces\n        eight\n",
    "3.14159 1,000,000 2024-01-31 12:30 \u0661\u0662\u0663 \u00bd \u2460",
    "Well... (maybe) [yes]? {no}! #hash @at $5 100% a&b \"quoted\" 'single'",
    "no\u00a0break\u3000ideographic\u2028line\u2029para\u0085nel\u000bvt\u000cff",
    "def f(x):\n    return x ** 2  # square\n",
    " = Valkyria Chronicles III = \n",
    "\U00010348 \U0001d11e \u00ff\u0100 \u0000 \u007f",
]


def encode_ids(tok, pieces):
    ids = []
    for piece in pieces:
        ids.extend(tok.encode(piece, add_special_tokens=False).ids)
    return ids


def pieces_of(path, how):
    with open(path, "rb") as f:
        data = f.read().decode("utf-8")
    if how == "lines":
        # Cut at "\n" only (str.splitlines would also cut at \r, \x1c, U+2028, ...), keeping each line's "\n".
        lines = data.split("\n")
        pieces = [line + "\n" for line in lines[:-1]]
        if lines[-1]:
            pieces.append(lines[-1])
        return pieces
    if how == "jsonl_text":
        return [json.loads(line)["text"] for line in data.split("\n") if line.strip()]
    raise ValueError(how)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data_dir = os.environ.get("HGRN_SHARED_DATA", os.path.join(repo, "..", "shared", "data"))
    parser.add_argument("--data-dir", default=default_data_dir)
    parser.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "tokenizer_ids.json"))
    args = parser.parse_args()

    fixture = {
        "generator": "tools/make_tokenizer_fixtures.py",
        "tokenizers_version": tokenizers.__version__,
        "files": [],
        "strings": [],
    }
    for tok_rel in TOKENIZERS:
        tok = tokenizers.Tokenizer.from_file(os.path.join(args.data_dir, tok_rel))
        for text_rel, how in TEXT_FILES:
            ids = encode_ids(tok, pieces_of(os.path.join(args.data_dir, text_rel), how))
            digest = hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()
            fixture["files"].append({"tokenizer": tok_rel, "text": text_rel, "split": how, "num_ids": len(ids),
                                     "sha256": digest, "first_ids": ids[:200]})
            print(f"{tok_rel} {text_rel}: {len(ids)} ids sha256 {digest[:16]}...", file=sys.stderr)
        for text in HAND_PICKED:
            ids = tok.encode(text, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=False)
            fixture["strings"].append({"tokenizer": tok_rel, "text": text, "ids": ids, "decoded": decoded})

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
