#!/usr/bin/env bash
# gpu_side_by_side.sh: hgrn and the peer (PyTorch + flash-linear-attention) on the same GPU in one run, for the three
# peer-baseline configs: `hgrn bench` and tools/peer_bench.py (amp-bf16 and pure-bf16), then a table of tokens/s,
# peak memory and the ratios. Needs torch (with CUDA) and transformers; fla and the peer's Triton cache come as
# scripts/peer_env.sh describes (FLA_WHEELS, PEER_CACHE_IN, PEER_CACHE_OUT, TRITON_CACHE_DIR). Builds build-gpu/ like
# gpu_tests.sh when it is missing.
# Usage: scripts/gpu_side_by_side.sh [OUTPUT_DIR]   (default build-gpu/side-by-side)
#   MODELS="hgrn2-150m hgrn2-385m hgrn2-1b"  PEER_MODES="amp-bf16 pure-bf16"  BENCH_WARMUP=5 BENCH_STEPS=20 (hgrn)
# hgrn is timed as the peer is (5 warm-up steps, then 20): under an H200's power limit the step time swings with a
# period of about five steps, so ten steps' median and mean both depend on where the swing falls.
# Give a fresh machine's first peer run a generous limit, or carry a Triton cache from an earlier run on that kind
# of machine (PEER_CACHE_IN). The peer's output is unbuffered, so a run stopped at its limit still shows how far it
# got.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/side-by-side}
mkdir -p "$out"
source scripts/peer_env.sh
if [ ! -x build-gpu/hgrn ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHGRN_CUDA=ON ${HGRN_CMAKE_ARGS:-}
  cmake --build build-gpu -j"$(nproc)" --target hgrn
fi
{
  echo "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python3 -c "import torch, fla; print('torch', torch.__version__, 'fla', getattr(fla, '__version__', '?'))"
} | tee "$out/machine.txt"
for model in ${MODELS:-hgrn2-150m hgrn2-385m hgrn2-1b}; do
  read -r layers hidden batch <<<"$(peer_shape "$model")"
  for mode in ${PEER_MODES:-amp-bf16 pure-bf16}; do
    PYTHONUNBUFFERED=1 python3 tools/peer_bench.py --layers "$layers" --hidden "$hidden" --batch "$batch" --mode "$mode" \
      --json "$out/peer-$model-$mode.json" > "$out/peer-$model-$mode.txt" 2>&1 ||
      { echo "peer $model $mode failed:"; tail -5 "$out/peer-$model-$mode.txt"; }
  done
  ./build-gpu/hgrn bench --config "configs/$model.yaml" --warmup "${BENCH_WARMUP:-5}" --steps "${BENCH_STEPS:-20}" \
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
