#!/usr/bin/env bash
# gpu_bench.sh: the GPU benchmarks of docs/benchmarks.md, on a machine with an NVIDIA GPU: the HGRU2 recurrence at
# the peer's shape, then whole training steps of the three peer-sized configs (hgrn bench), each also as JSON.
# Usage: scripts/gpu_bench.sh [OUTPUT_DIR]   (default build-gpu/bench; builds build-gpu/hgrn if missing: scripts/gpu_build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/bench}
mkdir -p "$out"
scripts/gpu_build.sh
{
  echo "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
} | tee "$out/machine.txt"
./build-gpu/hgrn bench --recurrence 8,2048,8,128,128 --dtype bf16 --json "$out/recurrence.json" | tee "$out/recurrence.txt"
for model in ${BENCH_MODELS:-hgrn2-150m hgrn2-385m hgrn2-1b}; do
  ./build-gpu/hgrn bench --config "configs/$model.yaml" --warmup "${BENCH_WARMUP:-3}" --steps "${BENCH_STEPS:-10}" \
    --json "$out/$model.json" 2>&1 | tee "$out/$model.txt" || echo "bench $model failed (see $out/$model.txt)"
done
