#!/usr/bin/env bash
# gpu_ab.sh: an A/B of two source trees on one GPU machine, in one run: builds BASE (another revision's tree, e.g.
# unpacked here by `mkdir -p .ab/base && git archive <rev> | tar -x -C .ab/base`) and this tree, then alternates their
# `hgrn bench` runs (base, this, base, this, ...) so that both see the same machine state: the HGRU2 recurrence at
# the peer's shape (bf16), then whole training steps of each config in AB_MODELS. Prints one table last.
# Usage: scripts/gpu_ab.sh BASE_DIR [OUTPUT_DIR]   (default build-gpu/ab)
#   AB_ROUNDS=2 (alternations)  AB_MODELS="hgrn2-385m"  AB_WARMUP=2  AB_STEPS=5
#   AB_RECURRENCE=8,2048,8,128,128 (B,T,H,K,V; empty: skip)  HGRN_CMAKE_ARGS (both builds)
#   AB_SET="training.deterministic=true ..." (config overrides for every model run, e.g. cuBLASLt's heuristic GEMM
#     picks instead of timed ones, so that autotuning's run-to-run choices do not blur a small change)
#   AB_TIMELINE=1: also a kernel timeline of each model's steps for both trees (tools/kernel_timeline.cpp, 3 steps
#     after 2 warm-up) and tools/timeline_summary.py --compare of the two: GPU time per step by part and kernel,
#     which shows changes of well under 1% that the steps' wall-clock medians do not.
set -euo pipefail
cd "$(dirname "$0")/.."
base_src=$(cd "${1:?usage: scripts/gpu_ab.sh BASE_DIR [OUTPUT_DIR]}" && pwd)
out=${2:-build-gpu/ab}
mkdir -p "$out"
[ -f "$base_src/CMakeLists.txt" ] || { echo "gpu_ab: $base_src holds no hgrn tree (no CMakeLists.txt)" >&2; exit 1; }
configure() {  # source build-dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHGRN_CUDA=ON ${HGRN_CMAKE_ARGS:-} > "$2.configure.log" 2>&1 ||
    { cat "$2.configure.log"; return 1; }
}
mkdir -p build-gpu
configure "$base_src" build-gpu/ab-base
configure . build-gpu
# Both builds at once (the machine has cores to spare); the base needs only the binary.
cmake --build build-gpu/ab-base -j"$(nproc)" --target hgrn > "$out/build-base.log" 2>&1 &
base_build=$!
cmake --build build-gpu -j"$(nproc)" --target hgrn > "$out/build-this.log" 2>&1 || { tail -30 "$out/build-this.log"; exit 1; }
wait "$base_build" || { tail -30 "$out/build-base.log"; exit 1; }
declare -A bin=([base]=build-gpu/ab-base/hgrn [this]=build-gpu/hgrn)
recurrence=${AB_RECURRENCE-8,2048,8,128,128}  # empty: skip
models=${AB_MODELS-hgrn2-385m}
overrides=()
for o in ${AB_SET:-}; do overrides+=(--set "$o"); done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/machine.txt" || true
rows=()
for round in $(seq "${AB_ROUNDS:-2}"); do
  for side in base this; do
    if [ -n "$recurrence" ]; then
      log="$out/recurrence-$side-$round.json"
      "${bin[$side]}" bench --recurrence "$recurrence" --dtype bf16 --json "$log" > "$log.txt" 2>&1
      rows+=("$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'| recurrence {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {r[\"forward_ms\"]:.4f} ms fwd, {r[\"forward_backward_ms\"]:.4f} ms fwd+bwd |')" \
        "$log" "$recurrence" "$side" "$round")")
    fi
    for model in $models; do
      log="$out/$model-$side-$round.json"
      "${bin[$side]}" bench --config "configs/$model.yaml" ${overrides[@]+"${overrides[@]}"} --warmup "${AB_WARMUP:-2}" \
        --steps "${AB_STEPS:-5}" --json "$log" > "$log.txt" 2>&1 || { echo "gpu_ab: $model ($side) failed:"; tail -5 "$log.txt"; continue; }
      rows+=("$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {r[\"median_ms\"]:.2f} ms, {r[\"tokens_per_s\"]:.0f} tok/s, {r[\"peak_memory_gib\"]:.2f} GiB |')" \
        "$log" "$model" "$side" "$round")")
    done
  done
done
{
  echo "| what | side | round | result |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/ab.md"
if [ "${AB_TIMELINE:-0}" = 1 ]; then
  # The CUPTI library is this tree's; it records any binary's kernels.
  cmake --build build-gpu -j"$(nproc)" --target hgrn_kernel_timeline > "$out/build-timeline.log" 2>&1 ||
    { tail -30 "$out/build-timeline.log"; exit 1; }
  for model in $models; do
    for side in base this; do
      CUDA_INJECTION64_PATH=build-gpu/libhgrn_kernel_timeline.so HGRN_TIMELINE_OUT="$out/timeline-$model-$side.csv" \
        "${bin[$side]}" bench --config "configs/$model.yaml" ${overrides[@]+"${overrides[@]}"} --warmup 2 --steps 3 \
        > "$out/timeline-$model-$side.txt" 2>&1 ||
        { echo "gpu_ab: the $model timeline ($side) failed:"; tail -5 "$out/timeline-$model-$side.txt"; continue 2; }
    done
    echo "== $model: GPU time per step, base -> this"
    python3 tools/timeline_summary.py "$out/timeline-$model-this.csv" --steps 2 \
      --compare "$out/timeline-$model-base.csv" | tee "$out/timeline-$model-compare.txt"
  done
fi
