#!/usr/bin/env bash
# bench_prepare.sh: tokenising speed of `hgrn prepare` against the Python `tokenizers` package on WikiText-2 train
# with the GPT-2 tokenizer.json. A benchmark, not a test: it prints tokens per second per core and checks nothing.
#
#   hgrn      `hgrn prepare --threads 1` and `--threads 2`: wall time of the whole process (tokenizer.json load,
#             reading, tokenising, writing and fsync'ing the shards), divided by the number of tokenising threads.
#   python    tokenizers' Tokenizer.encode(line, add_special_tokens=False) on every line of the file, one thread
#             (RAYON_NUM_THREADS=1), timing the encoding loop only (the load is printed separately).
# Each figure is the best of REPEATS runs (default 3): on a shared machine the fastest run is the least disturbed.
#
# Environment: HGRN_BINARY (default build/hgrn), HGRN_SHARED_DATA (default ../shared/data), REPEATS, PYTHON.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
hgrn="${HGRN_BINARY:-$root/build/hgrn}"
data="${HGRN_SHARED_DATA:-$root/../shared/data}"
corpus="$data/wikitext-2/train.txt"
tokenizer="$data/tokenizers/gpt2/tokenizer.json"
repeats="${REPEATS:-3}"
python="${PYTHON:-python3}"

for file in "$corpus" "$tokenizer"; do
  [[ -f "$file" ]] || { echo "bench_prepare: $file not found (set HGRN_SHARED_DATA to the shared data folder)" >&2; exit 1; }
done
[[ -x "$hgrn" ]] || { echo "bench_prepare: $hgrn is not an executable (build hgrn, or set HGRN_BINARY)" >&2; exit 1; }
"$python" -c 'import tokenizers' 2>/dev/null ||
  { echo "bench_prepare: the Python package 'tokenizers' is not installed (pip install tokenizers)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }

corpus_mb="$("$python" -c 'import os, sys; print(f"{os.path.getsize(sys.argv[1]) / 1e6:.2f}")' "$corpus")"
echo "WikiText-2 train ($corpus_mb MB), GPT-2 tokenizer.json, best of $repeats runs, $(nproc) cores visible"

for threads in 1 2; do
  best=""
  for _ in $(seq "$repeats"); do
    start="$(now)"
    "$hgrn" prepare --corpus wikitext --input "$corpus" --tokenizer "$tokenizer" --output "$work/wt2" \
      --threads "$threads" --force 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
    end="$(now)"
    best="$("$python" -c 'import sys; e = float(sys.argv[2]) - float(sys.argv[1]); b = sys.argv[3]
print(e if not b else min(e, float(b)))' "$start" "$end" "$best")"
  done
  "$python" - "$work/wt2_train.json" "$best" "$threads" <<'EOF'
import json, sys
tokens = json.load(open(sys.argv[1]))["tokens"]
seconds, threads = float(sys.argv[2]), int(sys.argv[3])
print(f"hgrn prepare --threads {threads}: {tokens} tokens (EOS included) in {seconds:.3f} s wall = "
      f"{tokens / seconds / 1e6:.2f} M tokens/s, {tokens / seconds / threads / 1e6:.2f} M tokens/s per core")
EOF
done

RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$python" - "$tokenizer" "$corpus" "$repeats" <<'EOF'
import sys, time
import tokenizers
from tokenizers import Tokenizer

path, corpus, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
tok = Tokenizer.from_file(path)
load = time.perf_counter() - start
with open(corpus, encoding="utf-8") as f:
    lines = f.read().splitlines(keepends=True)
best = float("inf")
for _ in range(repeats):
    start = time.perf_counter()
    tokens = 0
    for line in lines:
        tokens += len(tok.encode(line, add_special_tokens=False).ids)
    best = min(best, time.perf_counter() - start)
print(f"python tokenizers {tokenizers.__version__} (per line, 1 thread): {tokens} tokens in {best:.3f} s encoding "
      f"(+ {load:.3f} s load) = {tokens / best / 1e6:.2f} M tokens/s per core")
EOF
