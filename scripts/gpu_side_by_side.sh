#!/usr/bin/env bash
# gpu_side_by_side.sh: hgrn and the peer (PyTorch + flash-linear-attention) on the same GPU in one run, for the three
# peer-baseline configs: `hgrn bench` and tools/peer_bench.py (amp-bf16 and pure-bf16), then a table of tokens/s,
# peak memory and the ratios. Needs torch (with CUDA) and transformers; fla comes from wheels in FLA_WHEELS
# (default .whl: flash_linear_attention, fla_core and einops wheels, e.g. fetched on a machine with PyPI by
#   python3 -m pip download --no-deps --only-binary=:all: flash-linear-attention fla-core einops -d .whl)
# or from an installed fla. Builds build-gpu/ like gpu_tests.sh when it is missing.
# Usage: scripts/gpu_side_by_side.sh [OUTPUT_DIR]   (default build-gpu/side-by-side)
#   MODELS="hgrn2-150m hgrn2-385m hgrn2-1b"  PEER_MODES="amp-bf16 pure-bf16"  BENCH_STEPS=10 (hgrn)
# fla compiles and autotunes its Triton kernels on first use: on a fresh H200 machine the first peer run takes
# 350-400 s (sessions 14, 15), the next ones of the same config 25 s. Give it a run of its own with a generous limit,
# or carry a Triton cache from an earlier run on that kind of machine (TRITON_CACHE_DIR, passed through; fla keeps its
# autotuning results there too). Only the cubins and json files are needed (77 MB for the three configs, 17 MB
# gzipped): PEER_CACHE_IN=DIR unpacks DIR/triton-cache.tgz.part-* before the peer runs, PEER_CACHE_OUT=DIR writes the
# cache (pruned to those files, gzipped, in parts of 15 MiB: within the device tool's per-file limit) there after
# them; both use TRITON_CACHE_DIR, default /tmp/hgrn-triton-cache when either is set (unpacking into another
# directory than the pack was made in rewrites the cache's absolute paths).
# The peer's output is unbuffered, so a run stopped at its limit still shows how far it got.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/side-by-side}
mkdir -p "$out"
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
if [ ! -x build-gpu/hgrn ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHGRN_CUDA=ON ${HGRN_CMAKE_ARGS:-}
  cmake --build build-gpu -j"$(nproc)" --target hgrn
fi
wheels=${FLA_WHEELS:-.whl}
if ! python3 -c "import fla" 2>/dev/null; then
  ls "$wheels"/*.whl >/dev/null 2>&1 || { echo "no fla installed and no wheels in $wheels (see the header)" >&2; exit 1; }
  pylib=${TMPDIR:-/tmp}/hgrn-peer-pylib
  python3 -m pip install --quiet --no-deps --no-index --target "$pylib" "$wheels"/*.whl
  export PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  echo "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python3 -c "import torch, fla; print('torch', torch.__version__, 'fla', getattr(fla, '__version__', '?'))"
} | tee "$out/machine.txt"
shape() {  # the peer-baseline shapes: layers hidden batch
  case "$1" in
    hgrn2-150m) echo "15 768 16" ;;
    hgrn2-385m) echo "26 1024 16" ;;
    hgrn2-1b) echo "18 2048 8" ;;
  esac
}
for model in ${MODELS:-hgrn2-150m hgrn2-385m hgrn2-1b}; do
  read -r layers hidden batch <<<"$(shape "$model")"
  for mode in ${PEER_MODES:-amp-bf16 pure-bf16}; do
    PYTHONUNBUFFERED=1 python3 tools/peer_bench.py --layers "$layers" --hidden "$hidden" --batch "$batch" --mode "$mode" \
      --json "$out/peer-$model-$mode.json" > "$out/peer-$model-$mode.txt" 2>&1 ||
      { echo "peer $model $mode failed:"; tail -5 "$out/peer-$model-$mode.txt"; }
  done
  ./build-gpu/hgrn bench --config "configs/$model.yaml" --warmup "${BENCH_WARMUP:-3}" --steps "${BENCH_STEPS:-10}" \
    --json "$out/hgrn-$model.json" > "$out/hgrn-$model.txt" 2>&1 || { echo "hgrn $model failed:"; tail -5 "$out/hgrn-$model.txt"; }
done
python3 - "$out" ${MODELS:-hgrn2-150m hgrn2-385m hgrn2-1b} <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
# The peer's tokens/s come from its mean step (tools/peer_bench.py), hgrn's from its median step; the last ratio uses
# hgrn's mean step, the like-for-like one (a slow step or two under the power cap lowers it).
print("| model | peer amp-bf16 tok/s | peer pure-bf16 tok/s | hgrn tok/s (median step) | hgrn / best peer | "
      "hgrn / best peer, hgrn's mean step | peer amp GiB | hgrn GiB | hgrn / peer amp memory | hgrn MFU |")
print("|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    amp, pure, h = load(f"peer-{m}-amp-bf16"), load(f"peer-{m}-pure-bf16"), load(f"hgrn-{m}")
    peers = [r["tokens_per_s"] for r in (amp, pure) if r]
    best = max(peers) if peers else float("nan")
    f = lambda r, k, fmt: (fmt % r[k]) if r else "-"
    print(f"| {m} | {f(amp, 'tokens_per_s', '%.0f')} | {f(pure, 'tokens_per_s', '%.0f')} | "
          f"{f(h, 'tokens_per_s', '%.0f')} | {h['tokens_per_s'] / best:.2f}x | "
          f"{h.get('tokens_per_s_mean', float('nan')) / best:.3f}x | " if h else f"| {m} | - | - | - | - | - | ",
          end="")
    print(f"{f(amp, 'peak_memory_gib', '%.1f')} | {f(h, 'peak_memory_gib', '%.1f')} | "
          f"{(h['peak_memory_gib'] / amp['peak_memory_gib']) if (h and amp) else float('nan'):.2f}x | "
          f"{f(h, 'mfu', '%.3f')} |")
PY
