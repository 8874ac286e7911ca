#!/usr/bin/env bash
# gpu_scaling.sh: data-parallel scaling of whole training steps on one multi-GPU node: `hgrn bench` of a config
# at 1, 2, 4, ... GPUs (mpirun, one process per GPU, the same micro-batch per GPU), plain and with ZeRO-1, and the
# efficiency tokens/s(N) / (N x tokens/s(1)), with the time the communication stream spent on the gradient
# reductions a step and how far the last one ran past the backward. Beside each N > 1 it runs N independent 1-GPU
# benches at once (one a GPU, no communication): what the node itself leaves of N x one GPU, the part of the gap no
# reduction causes.
# Builds build-gpu/hgrn when it is missing (scripts/gpu_build.sh).
# Usage: scripts/gpu_scaling.sh [OUTPUT_DIR] [CONFIG]   (defaults build-gpu/scaling, configs/hgrn2-385m.yaml)
#   SCALING_GPUS="1 2 4"  BENCH_WARMUP=3  BENCH_STEPS=10  override the GPU counts and step counts;
#   HGRN_SET="training.precision=fp8" passes --set options to every bench (space-separated);
#   SCALING_APART=0 skips the independent benches.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/scaling}
config=${2:-configs/hgrn2-385m.yaml}
mkdir -p "$out"
scripts/gpu_build.sh
gpus=$(nvidia-smi --list-gpus | wc -l)
counts=${SCALING_GPUS:-$(for n in 1 2 4 8; do if [ "$n" -le "$gpus" ]; then echo "$n"; fi; done)}
root_flag=$([ "$(id -u)" -eq 0 ] && echo --allow-run-as-root || true)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/machine.txt"
bench=(./build-gpu/hgrn bench --config "$config" --warmup "${BENCH_WARMUP:-3}" --steps "${BENCH_STEPS:-10}")
for option in ${HGRN_SET:-}; do bench+=(--set "$option"); done
run() {  # run N ZERO1 NAME
  mpirun $root_flag -np "$1" --bind-to none -x NCCL_NVLS_ENABLE "${bench[@]}" --set training.zero1="$2" \
    --json "$out/$3.json" > "$out/$3.txt" 2>&1 || { echo "bench $3 failed:"; tail -20 "$out/$3.txt"; }
}
run_apart() {  # run_apart N: N 1-GPU benches at once, GPU g writing gpus<N>-apart-<g>
  for ((g = 0; g < $1; ++g)); do
    CUDA_VISIBLE_DEVICES=$g "${bench[@]}" --json "$out/gpus$1-apart-$g.json" > "$out/gpus$1-apart-$g.txt" 2>&1 ||
      echo "bench gpus$1-apart-$g failed (see $out/gpus$1-apart-$g.txt)" &
  done
  wait
}
for n in $counts; do
  run "$n" false "gpus$n"
  if [ "$n" -gt 1 ]; then
    run "$n" true "gpus$n-zero1"
    if [ "${SCALING_APART:-1}" != 0 ]; then run_apart "$n"; fi
  fi
done
python3 - "$out" $counts <<'PY'
import json, os, sys
out, counts = sys.argv[1], [int(c) for c in sys.argv[2:]]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
base = load("gpus1")
print("| GPUs | ZeRO-1 | tokens/s | per GPU | efficiency | step ms | peak GiB/GPU | reductions busy / tail ms |")
print("|---|---|---|---|---|---|---|---|")
def row(n, label, tokens, ms, peak, reductions="-"):
    eff = tokens / (n * base["tokens_per_s"]) if base else float("nan")
    print(f"| {n} | {label} | {tokens:.0f} | {tokens/n:.0f} | {100*eff:.1f}% | {ms} | {peak:.2f} | {reductions} |")
for n in counts:
    for z in ([""] if n == 1 else ["", "-zero1"]):
        r = load(f"gpus{n}{z}")
        if r: row(n, "yes" if z else "no", r["tokens_per_s"], f"{r['median_ms']:.1f}", r["peak_memory_gib"],
                  f"{r['reduce_busy_ms']:.1f} / {r['reduce_tail_ms']:.2f}" if r.get("reduce_buckets") else "-")
    apart = [load(f"gpus{n}-apart-{g}") for g in range(n)] if n > 1 else []
    if apart and all(apart):  # the sum of N independent runs: the node's own share of the gap
        ms = [a["median_ms"] for a in apart]
        row(n, "apart (no communication)", sum(a["tokens_per_s"] for a in apart), f"{min(ms):.1f}-{max(ms):.1f}",
            max(a["peak_memory_gib"] for a in apart))
PY
