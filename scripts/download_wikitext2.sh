#!/usr/bin/env bash
# download_wikitext2.sh: fetches WikiText-2 (Merity et al. 2016, CC BY-SA 3.0; the tokenized v1 split, with <unk>)
# and the GPT-2 byte-level BPE tokenizer that hgrn's GPT-2 configs use, checks every file's sha256, and puts them in
# one directory:
#
#   scripts/download_wikitext2.sh [DIR]                  (DIR defaults to data/wikitext-2)
#   scripts/download_wikitext2.sh --from SOURCE [DIR]    copy from a local copy instead of the network
#
# DIR receives train.txt, valid.txt and test.txt (= wiki.{train,valid,test}.tokens, 36,718 / 3,760 / 4,358 lines)
# and gpt2-tokenizer.json (GPT-2 as a Hugging Face tokenizers file, 50,257 ids). hgrn reads the text files with the
# "wikitext" corpus kind (one document per article) and the tokenizer with `hgrn prepare --tokenizer`.
#
# Sources (pinned commits, so the checksums below hold): the three text files are pytorch/examples'
# word_language_model/data/wikitext-2/ at 644bf70, where the dataset's author put them; the tokenizer is
# EleutherAI/gpt-neox's tests/data/hf_cache/tokenizer/gpt2.json at ea7aefd (a pretty-printed tokenizer.json whose
# vocabulary and merges equal OpenAI's GPT-2 files).
#
# --from SOURCE takes a directory that holds the files under any of the usual names (train.txt or wiki.train.tokens,
# also inside a wikitext-2/ subdirectory; gpt2-tokenizer.json, tokenizer.json, gpt2/tokenizer.json or
# tokenizers/gpt2/tokenizer.json) or a wikitext-2-v1.zip. Whatever the source, a file is kept only if its sha256 is
# the one below; files already in DIR with the right checksum are kept. Without network it stops with a message
# saying so, leaving no partial files.
#
# Environment:
#   HGRN_WIKITEXT2_URL     base URL of a mirror holding train.txt, valid.txt, test.txt (and gpt2-tokenizer.json)
#   HGRN_GPT2_TOKENIZER_URL  URL of the GPT-2 tokenizer.json (default: the gpt-neox file above)
#   HGRN_CONNECT_TIMEOUT   seconds curl waits to connect (default 20)
set -euo pipefail

fail() {
  echo "download_wikitext2.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
}

source_path=""
destination=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --from)
      [[ $# -ge 2 ]] || fail "--from needs a directory or a wikitext-2-v1.zip"
      source_path="$2"
      shift 2
      ;;
    --from=*) source_path="${1#--from=}"; shift ;;
    -*) fail "unknown option '$1' (see --help)" ;;
    *)
      [[ -z "$destination" ]] || fail "more than one destination given ('$destination', '$1'; see --help)"
      destination="$1"
      shift
      ;;
  esac
done
destination="${destination:-data/wikitext-2}"
connect_timeout="${HGRN_CONNECT_TIMEOUT:-20}"

# name:sha256 of every file this script provides.
files=(
  "train.txt:9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"
  "valid.txt:f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"
  "test.txt:d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"
  "gpt2-tokenizer.json:e88dafdf79f2026eaffb161c36a8b914b5fa586a620d108b9fecc117f74dbdd7"
)
wikitext_base="https://raw.githubusercontent.com/pytorch/examples/644bf702c16234d2fbbaefa155d759f296894165/word_language_model/data/wikitext-2"
tokenizer_url="${HGRN_GPT2_TOKENIZER_URL:-https://raw.githubusercontent.com/EleutherAI/gpt-neox/ea7aefd8f8e183256992d9fede4d7c71a46d67a5/tests/data/hf_cache/tokenizer/gpt2.json}"

if command -v sha256sum > /dev/null 2>&1; then
  sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum > /dev/null 2>&1; then
  sha256_of() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  fail "needs sha256sum (coreutils) or shasum to check the files; install one and run again"
fi

# The URL a file is downloaded from.
url_of() {
  if [[ "$1" == gpt2-tokenizer.json && -n "${HGRN_GPT2_TOKENIZER_URL:-}" ]]; then
    echo "$tokenizer_url"
  elif [[ -n "${HGRN_WIKITEXT2_URL:-}" ]]; then
    echo "${HGRN_WIKITEXT2_URL%/}/$1"
  elif [[ "$1" == gpt2-tokenizer.json ]]; then
    echo "$tokenizer_url"
  else
    echo "$wikitext_base/$1"
  fi
}

# The names a local copy may use for a file, relative to the --from directory.
candidates_of() {
  case "$1" in
    train.txt | valid.txt | test.txt)
      local split="${1%.txt}"
      echo "$1 wiki.$split.tokens wikitext-2/$1 wikitext-2/wiki.$split.tokens"
      ;;
    gpt2-tokenizer.json) echo "gpt2-tokenizer.json tokenizer.json gpt2/tokenizer.json tokenizers/gpt2/tokenizer.json" ;;
  esac
}

# What a curl exit status means for the user.
explain_curl_status() {
  case "$1" in
    5 | 6) echo "the host name could not be resolved: no network connection or no DNS (curl status $1)" ;;
    7) echo "could not connect to the host: no network connection, or a firewall blocks it (curl status 7)" ;;
    28) echo "the connection timed out: no network connection, or the host is unreachable (curl status 28)" ;;
    22) echo "the server answered with an HTTP error: the file may have moved; set HGRN_WIKITEXT2_URL to a mirror (curl status 22)" ;;
    35 | 60) echo "the TLS handshake failed: check the system's CA certificates or a proxy (curl status $1)" ;;
    *) echo "curl failed with status $1 (see 'man curl', EXIT CODES)" ;;
  esac
}

# Moves $1 to $destination/$2 if its sha256 is $3; otherwise removes it and fails with what was wrong.
commit_checked() {
  local file="$1" name="$2" expected="$3" origin="$4" actual
  actual="$(sha256_of "$file")"
  if [[ "$actual" != "$expected" ]]; then
    rm -f "$file"
    fail "$origin: sha256 $actual, expected $expected: not the file this script provides (a different version or a damaged copy); it was not kept"
  fi
  mv "$file" "$destination/$name"
}

mkdir -p "$destination"

# A zip given as the source: extract its members into a scratch directory and read them from there.
scratch=""
cleanup() {
  [[ -z "$scratch" ]] || rm -rf "$scratch"
  rm -f "$destination"/*.part
}
trap cleanup EXIT
if [[ -n "$source_path" ]]; then
  [[ -e "$source_path" ]] || fail "--from $source_path: no such file or directory"
  if [[ -f "$source_path" ]]; then
    command -v unzip > /dev/null 2>&1 || fail "needs unzip to read $source_path; install it (e.g. sudo apt-get install unzip)"
    scratch="$(mktemp -d)"
    unzip -oqj "$source_path" '*wiki.train.tokens' '*wiki.valid.tokens' '*wiki.test.tokens' -d "$scratch" 2> /dev/null ||
      fail "--from $source_path: not a zip holding wiki.{train,valid,test}.tokens (the WikiText-2 v1 zip)"
    source_path="$scratch"
  fi
fi

missing_locally=()
for entry in "${files[@]}"; do
  name="${entry%%:*}"
  expected="${entry#*:}"
  target="$destination/$name"
  if [[ -s "$target" && "$(sha256_of "$target")" == "$expected" ]]; then
    echo "$name: already in $destination (sha256 checked)"
    continue
  fi
  partial="$target.part"
  if [[ -n "$source_path" ]]; then
    found=""
    for candidate in $(candidates_of "$name"); do
      if [[ -f "$source_path/$candidate" ]]; then
        found="$source_path/$candidate"
        break
      fi
    done
    if [[ -z "$found" ]]; then
      missing_locally+=("$name")
      continue
    fi
    cp "$found" "$partial"
    chmod u+w "$partial"
    commit_checked "$partial" "$name" "$expected" "$found"
    echo "$name: copied from $found (sha256 checked)"
    continue
  fi
  command -v curl > /dev/null 2>&1 || fail "needs curl; install it (e.g. sudo apt-get install curl) and run again, or pass --from with a local copy"
  url="$(url_of "$name")"
  echo "downloading $url"
  status=0
  curl --fail --location --progress-bar --connect-timeout "$connect_timeout" --retry 2 --retry-delay 2 \
    --output "$partial" "$url" || status=$?
  if [[ $status -ne 0 ]]; then
    rm -f "$partial"
    fail "could not download $name (is there a network connection?): $url: $(explain_curl_status "$status")
  Without network, copy the files from another machine and run: scripts/download_wikitext2.sh --from DIR $destination"
  fi
  commit_checked "$partial" "$name" "$expected" "$url"
  echo "$name: downloaded into $destination (sha256 checked)"
done

missing_text=()
for name in "${missing_locally[@]+"${missing_locally[@]}"}"; do
  if [[ "$name" == gpt2-tokenizer.json ]]; then
    echo "download_wikitext2.sh: note: $source_path holds no GPT-2 tokenizer (looked for: $(candidates_of "$name")); the byte-level configs need none, the GPT-2 ones do: run again without --from, or with a directory that has it" >&2
  else
    missing_text+=("$name")
  fi
done
if [[ ${#missing_text[@]} -gt 0 ]]; then
  fail "--from $source_path holds no ${missing_text[*]} (looked for: $(for m in "${missing_text[@]}"; do candidates_of "$m"; done | tr '\n' ' ')); the files found were kept in $destination"
fi
echo "WikiText-2 is in $destination (read it with: hgrn prepare --corpus wikitext)"
