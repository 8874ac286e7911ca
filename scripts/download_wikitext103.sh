#!/usr/bin/env bash
# download_wikitext103.sh: downloads WikiText-103 (Merity et al. 2016, CC BY-SA), both the tokenized v1 zip
# (wiki.{train,valid,test}.tokens, with <unk>) and the raw v1 zip (wiki.{train,valid,test}.raw), checks each zip
# with `unzip -t`, and extracts the six files flat into a directory:
#
#   scripts/download_wikitext103.sh [DIR]        (DIR defaults to data/wikitext-103)
#
# hgrn reads them with the "wikitext" corpus kind (one document per article). Already extracted files are kept;
# run it again after a failure. Without network it stops with a message saying so, leaving no partial files.
#
# Environment:
#   HGRN_WIKITEXT103_URL   base URL that holds wikitext-103-v1.zip and wikitext-103-raw-v1.zip (a mirror);
#                          default: the dataset author's host, then the original Salesforce S3 location
#   HGRN_CONNECT_TIMEOUT   seconds curl waits to connect (default 20)
#
# data/ (the repository's top-level data directory) is for such local corpora: it is git-ignored except for its
# README. The small public samples the tests use are not in the repository at all (see data/README.md).
#
# The Pile: EleutherAI no longer distributes it (the original the-eye.eu shards were taken down), so there is no
# download here. Copies on the Hugging Face Hub include EleutherAI/pile-deduped-pythia-preshuffled and
# EleutherAI/pile-standard-pythia-preshuffled (the exact token streams the Pythia models were trained on,
# pre-tokenized with GPT-NeoX-20B as Megatron .bin/.idx shards; pythia's utils/unshard_memmap.py joins them),
# EleutherAI/the_pile_deduplicated (text, parquet), EleutherAI/pile_val_test (val/test .jsonl) and
# monology/pile-uncopyrighted (the original .jsonl.zst layout without the copyrighted components). Check the terms
# of each Pile component before use. hgrn reads Pile text shards as .jsonl or streaming .jsonl.zst (the "pile"
# corpus kind: {"text": ..., "meta": {"pile_set_name": ...}} per line) and pre-tokenized Megatron .bin/.idx pairs.
set -euo pipefail

destination="${1:-data/wikitext-103}"
connect_timeout="${HGRN_CONNECT_TIMEOUT:-20}"
if [[ -n "${HGRN_WIKITEXT103_URL:-}" ]]; then
  base_urls=("${HGRN_WIKITEXT103_URL%/}")
else
  base_urls=("https://wikitext.smerity.com" "https://s3.amazonaws.com/research.metamind.io/wikitext")
fi

fail() {
  echo "download_wikitext103.sh: $*" >&2
  exit 1
}

for tool in curl unzip; do
  command -v "$tool" > /dev/null 2>&1 || fail "needs $tool; install it (e.g. sudo apt-get install $tool) and run again"
done

# What a curl exit status means for the user.
explain_curl_status() {
  case "$1" in
    5 | 6) echo "the host name could not be resolved: no network connection or no DNS (curl status $1)" ;;
    7) echo "could not connect to the host: no network connection, or a firewall blocks it (curl status 7)" ;;
    28) echo "the connection timed out: no network connection, or the host is unreachable (curl status 28)" ;;
    22) echo "the server answered with an HTTP error: the file may have moved; set HGRN_WIKITEXT103_URL to a mirror (curl status 22)" ;;
    35 | 60) echo "the TLS handshake failed: check the system's CA certificates or a proxy (curl status $1)" ;;
    *) echo "curl failed with status $1 (see 'man curl', EXIT CODES)" ;;
  esac
}

# Downloads zip $1 into $destination/$1, trying each base URL; the file appears under its name only once complete.
download_zip() {
  local name="$1" partial="$destination/$1.part" status=0 reasons=""
  for base in "${base_urls[@]}"; do
    echo "downloading $base/$name"
    status=0
    curl --fail --location --progress-bar --connect-timeout "$connect_timeout" --retry 2 --retry-delay 2 \
      --output "$partial" "$base/$name" || status=$?
    if [[ $status -eq 0 ]]; then
      mv "$partial" "$destination/$name"
      return 0
    fi
    rm -f "$partial"
    reasons+=$'\n'"  $base/$name: $(explain_curl_status "$status")"
  done
  fail "could not download $name (is there a network connection?):$reasons"
}

mkdir -p "$destination"
for pair in "wikitext-103-v1.zip:wiki.train.tokens wiki.valid.tokens wiki.test.tokens" \
            "wikitext-103-raw-v1.zip:wiki.train.raw wiki.valid.raw wiki.test.raw"; do
  zip_name="${pair%%:*}"
  read -r -a members <<< "${pair#*:}"
  complete=1
  for member in "${members[@]}"; do
    [[ -s "$destination/$member" ]] || complete=0
  done
  if [[ $complete -eq 1 ]]; then
    echo "$zip_name: already extracted in $destination"
    continue
  fi
  [[ -s "$destination/$zip_name" ]] || download_zip "$zip_name"
  if ! unzip -tq "$destination/$zip_name" > /dev/null; then
    rm -f "$destination/$zip_name"
    fail "$zip_name failed its integrity check (unzip -t): the download is damaged; it was removed, run again"
  fi
  # -j: the zips hold wikitext-103/ and wikitext-103-raw/ folders; the six files have distinct names, so flatten.
  unzip -oqj "$destination/$zip_name" "${members[@]/#/*/}" -d "$destination"
  for member in "${members[@]}"; do
    [[ -s "$destination/$member" ]] || fail "$zip_name did not contain $member; is it the WikiText-103 v1 zip?"
  done
  rm -f "$destination/$zip_name"
  echo "$zip_name: extracted ${members[*]} into $destination"
done
echo "WikiText-103 is in $destination (read it with the wikitext corpus kind)"
