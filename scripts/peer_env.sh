# peer_env.sh: the peer's environment for the scripts that run it beside hgrn (gpu_side_by_side.sh,
# gpu_loss_parity.sh), sourced from the repository root: fla from wheels and the Triton cache.
# - fla: an installed one, else the wheels in FLA_WHEELS (default .whl: flash_linear_attention, fla_core and einops;
#   torchao too for tools/peer_bench.py's float8-amp mode), e.g. fetched on a machine with PyPI by
#     python3 -m pip download --no-deps --only-binary=:all: flash-linear-attention fla-core einops torchao -d .whl
#   and installed into a private directory put on PYTHONPATH.
# - The Triton cache: fla compiles and autotunes its Triton kernels on first use (350-400 s on a fresh H200 for the
#   three peer-baseline configs; the next runs of a config 25 s). PEER_CACHE_IN=DIR unpacks
#   DIR/triton-cache.tgz.part-* before the peer runs; PEER_CACHE_OUT=DIR packs the cache's cubins and json files
#   (gzipped, in parts of 15 MiB: within the device tool's per-file limit) there when the calling script exits; both
#   use TRITON_CACHE_DIR, default /tmp/hgrn-triton-cache when either is set (unpacking into another directory than
#   the pack was made in rewrites the cache's absolute paths).
if [ -n "${PEER_CACHE_IN:-}${PEER_CACHE_OUT:-}" ]; then
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/hgrn-triton-cache}
  mkdir -p "$TRITON_CACHE_DIR"
fi
# Triton's cache index files (__grp__*.json) name their kernels' files by absolute path: a pack records the directory
# it was made in (hgrn-cache-dir.txt), and unpacking into another one rewrites those paths.
if [ -n "${PEER_CACHE_IN:-}" ]; then
  if ls "$PEER_CACHE_IN"/triton-cache.tgz.part-* >/dev/null 2>&1; then
    cat "$PEER_CACHE_IN"/triton-cache.tgz.part-* | tar -C "$TRITON_CACHE_DIR" -xzf - ||
      { echo "PEER_CACHE_IN=$PEER_CACHE_IN: the parts do not make a gzipped tar (re-pack with PEER_CACHE_OUT)" >&2
        exit 1; }
    packed_in=$(cat "$TRITON_CACHE_DIR/hgrn-cache-dir.txt" 2>/dev/null || true)
    if [ -n "$packed_in" ] && [ "$packed_in" != "$TRITON_CACHE_DIR" ]; then
      find "$TRITON_CACHE_DIR" -name '__grp__*.json' -exec sed -i "s#\"$packed_in/#\"$TRITON_CACHE_DIR/#g" {} +
    fi
    echo "peer's Triton cache: $(du -sh "$TRITON_CACHE_DIR" | cut -f1) from $PEER_CACHE_IN (packed in ${packed_in:-?})"
  else
    echo "PEER_CACHE_IN=$PEER_CACHE_IN holds no triton-cache.tgz.part-*: the peer compiles from scratch" >&2
  fi
fi
# Packs the cache's cubins and json files (the cache itself is left alone) into PEER_CACHE_OUT on exit, so that a run
# stopped by an error still keeps what was compiled. The parts are written under a temporary name and moved in last:
# a failed pack never replaces a good one.
pack_peer_cache() {
  [ -n "${PEER_CACHE_OUT:-}" ] || return 0
  mkdir -p "$PEER_CACHE_OUT"
  local tmp
  tmp=$(mktemp -d "$PEER_CACHE_OUT/.packing.XXXXXX")
  echo "$TRITON_CACHE_DIR" > "$TRITON_CACHE_DIR/hgrn-cache-dir.txt"
  if (cd "$TRITON_CACHE_DIR" &&
      find . -type f \( -name '*.cubin' -o -name '*.json' -o -name hgrn-cache-dir.txt \) -print0 |
      tar --null -T - -czf -) | split -b 15M - "$tmp/triton-cache.tgz.part-"; then
    rm -f "$PEER_CACHE_OUT"/triton-cache.tgz.part-*
    mv "$tmp"/triton-cache.tgz.part-* "$PEER_CACHE_OUT"/
    echo "peer's Triton cache packed into $PEER_CACHE_OUT:" \
      "$(du -ch "$PEER_CACHE_OUT"/triton-cache.tgz.part-* | tail -1 | cut -f1)"
  else
    echo "packing the peer's Triton cache failed; $PEER_CACHE_OUT left as it was" >&2
  fi
  rm -rf "$tmp"
}
trap pack_peer_cache EXIT
wheels=${FLA_WHEELS:-.whl}
if ! python3 -c "import fla" 2>/dev/null; then
  ls "$wheels"/*.whl >/dev/null 2>&1 || { echo "no fla installed and no wheels in $wheels (see scripts/peer_env.sh)" >&2; exit 1; }
  pylib=${TMPDIR:-/tmp}/hgrn-peer-pylib
  python3 -m pip install --quiet --no-deps --no-index --target "$pylib" "$wheels"/*.whl
  export PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}"
fi
# The peer-baseline shapes (docs/benchmarks.md) of a config name: layers hidden batch.
peer_shape() {  # layers, hidden size, batch and fla's model_type of a shipped GPU config
  case "$1" in
    hgrn2-150m) echo "15 768 16 hgrn2" ;;
    hgrn2-385m) echo "26 1024 16 hgrn2" ;;
    hgrn2-1b) echo "18 2048 8 hgrn2" ;;
    hgrn1-150m) echo "15 768 16 hgrn" ;;
    hgrn1-385m) echo "26 1024 16 hgrn" ;;
    hgrn1-1b) echo "18 2048 8 hgrn" ;;
    gla-385m) echo "26 1024 16 gla" ;;
    retnet-385m) echo "26 1024 16 retnet" ;;
    *) echo "no peer-baseline shape for '$1' (expected hgrn2-150m, hgrn2-385m, hgrn2-1b, the hgrn1- ones, gla-385m" \
            "or retnet-385m)" >&2
       return 1 ;;
  esac
}
