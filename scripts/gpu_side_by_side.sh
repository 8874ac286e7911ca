#!/usr/bin/env bash
# gpu_side_by_side.sh: hgrn and the peer (PyTorch + flash-linear-attention) on the same GPU in one run, for the
# peer-baseline configs (hgrn2-*, hgrn1-* against fla's HGRN, gla-385m and retnet-385m against fla's GLA and RetNet): `hgrn bench` and tools/peer_bench.py (amp-bf16 and pure-bf16), then a table of tokens/s,
# peak memory and the ratios. Needs torch (with CUDA) and transformers; fla and the peer's Triton cache come as
# scripts/peer_env.sh describes (FLA_WHEELS, PEER_CACHE_IN, PEER_CACHE_OUT, TRITON_CACHE_DIR). Builds build-gpu/hgrn
# when it is missing (scripts/gpu_build.sh), unless HGRN_BIN (absolute, or relative to the repository root) names
# another build's binary to time, e.g. the base tree of scripts/gpu_ab.sh (build-gpu/ab-base/hgrn) with COMMIT naming
# its revision; the configs are this tree's either way.
# Usage: scripts/gpu_side_by_side.sh [OUTPUT_DIR]   (default build-gpu/side-by-side)
#   MODELS="hgrn2-150m hgrn2-385m hgrn2-1b" (or hgrn1-150m, hgrn1-385m, hgrn1-1b, gla-385m, retnet-385m)  PEER_MODES="amp-bf16 pure-bf16"  BENCH_WARMUP=5 BENCH_STEPS=20 (hgrn)
#   PEER_MODES may add float8-amp (torchao's float8 training; its wheel beside fla's), which the table sets beside
#   hgrn as its own column and ratio; HGRN_SET="training.precision=fp8" passes --set options to hgrn's bench.
#   COMMIT: the commit to record (default: git's HEAD, marked where the tree has changes).
#   ROUNDS=1: with more, each model's peer and hgrn runs repeat back to back (round r's files in OUTPUT_DIR/rR), and
#   the table adds a row per model over all rounds (each side's mean tokens/s): the machine's state moves either side
#   by 1-2% from one run to the next, as much as a target's margin, and alternating spreads that over both.
#   GPUS="0 1": the models spread over these GPUs (round robin), all GPUs at once, each running its models' peer and
#   hgrn runs in turn: every ratio is still of two runs on one GPU, in a fraction of the time (OUTPUT_DIR/gpu-N.log:
#   what each GPU printed). Default: the visible GPU, the models in turn.
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
models=(${MODELS:-hgrn2-150m hgrn2-385m hgrn2-1b})
for model in "${models[@]}"; do peer_shape "$model" > /dev/null; done  # a wrong name stops before the build
if [ -n "${HGRN_BIN:-}" ]; then
  [ -x "$HGRN_BIN" ] || { echo "gpu_side_by_side: HGRN_BIN=$HGRN_BIN is not an executable file" >&2; exit 1; }
  hgrn_bin=$HGRN_BIN
else
  scripts/gpu_build.sh
  hgrn_bin=./build-gpu/hgrn
fi
{
  # COMMIT names the tree where its git metadata is absent or stale (a copied working tree); a tree that differs from
  # its HEAD says so.
  echo "commit ${COMMIT:-$(git describe --always --abbrev=12 --dirty=' (with uncommitted changes)' 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python3 -c "import torch, fla; print('torch', torch.__version__, 'fla', getattr(fla, '__version__', '?'))"
} | tee "$out/machine.txt"
rounds=${ROUNDS:-1}
round_dir() { if [ "$rounds" -gt 1 ]; then echo "$out/r$1"; else echo "$out"; fi; }
hgrn_set=()
for option in ${HGRN_SET:-}; do hgrn_set+=(--set "$option"); done
measure() {  # model: its peer and hgrn runs, each round, on the visible GPU
  local model=$1 layers hidden batch model_type round dir mode
  read -r layers hidden batch model_type <<<"$(peer_shape "$model")"
  for round in $(seq 1 "$rounds"); do
    dir=$(round_dir "$round")
    mkdir -p "$dir"
    for mode in ${PEER_MODES:-amp-bf16 pure-bf16}; do
      PYTHONUNBUFFERED=1 python3 tools/peer_bench.py --model "$model_type" --layers "$layers" --hidden "$hidden" --batch "$batch" --mode "$mode" \
        --json "$dir/peer-$model-$mode.json" > "$dir/peer-$model-$mode.txt" 2>&1 ||
        { echo "peer $model $mode failed:"; tail -5 "$dir/peer-$model-$mode.txt"; }
    done
    "$hgrn_bin" bench --config "configs/$model.yaml" ${hgrn_set[@]+"${hgrn_set[@]}"} --warmup "${BENCH_WARMUP:-5}" --steps "${BENCH_STEPS:-20}" \
      --json "$dir/hgrn-$model.json" > "$dir/hgrn-$model.txt" 2>&1 || { echo "hgrn $model failed:"; tail -5 "$dir/hgrn-$model.txt"; }
  done
}
gpus=(${GPUS:-})
if [ "${#gpus[@]}" -le 1 ]; then
  if [ "${#gpus[@]}" -eq 1 ]; then export CUDA_VISIBLE_DEVICES=${gpus[0]}; fi
  for model in "${models[@]}"; do measure "$model"; done
else
  workers=()
  for i in "${!gpus[@]}"; do
    (
      export CUDA_VISIBLE_DEVICES=${gpus[$i]}
      for ((j = i; j < ${#models[@]}; j += ${#gpus[@]})); do
        echo "${models[$j]} on GPU ${gpus[$i]}" | tee -a "$out/machine.txt"
        measure "${models[$j]}"
      done
    ) > "$out/gpu-${gpus[$i]}.log" 2>&1 &
    workers+=($!)
  done
  for worker in "${workers[@]}"; do wait "$worker" || echo "a GPU worker stopped early: see $out/gpu-*.log"; done
  cat "$out"/gpu-*.log
fi
dirs=$(for round in $(seq 1 "$rounds"); do round_dir "$round"; done)
python3 - "$dirs" "${models[@]}" <<'PY'
import json, math, os, sys
dirs, models = sys.argv[1].split(), sys.argv[2:]
def load(d, name):
    p = os.path.join(d, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")
# The peer's tokens/s come from its mean step (tools/peer_bench.py), hgrn's from its median step; the "mean step"
# ratio uses hgrn's mean step, the like-for-like one (a slow step or two under the power cap lowers it). With several
# rounds, the last row of a model takes each figure's mean over the rounds that produced it.
print("| model | round | peer amp-bf16 tok/s | peer pure-bf16 tok/s | hgrn tok/s (median step) | hgrn / best peer | "
      "hgrn / best peer, hgrn's mean step | peer amp GiB | hgrn GiB | hgrn / peer amp memory | hgrn MFU | "
      "peer float8-amp tok/s | hgrn / peer float8, hgrn's mean step |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def row(m, label, amp, pure, h_median, h_mean, amp_gib, h_gib, mfu, float8):
    best = max((x for x in (amp, pure) if not math.isnan(x)), default=float("nan"))
    fmt = lambda x, spec, unit="": "-" if math.isnan(x) else format(x, spec) + unit
    print(f"| {m} | {label} | {fmt(amp, '.0f')} | {fmt(pure, '.0f')} | {fmt(h_median, '.0f')} | "
          f"{fmt(h_median / best, '.2f', 'x')} | {fmt(h_mean / best, '.3f', 'x')} | {fmt(amp_gib, '.1f')} | "
          f"{fmt(h_gib, '.1f')} | {fmt(h_gib / amp_gib, '.2f', 'x')} | {fmt(mfu, '.3f')} | {fmt(float8, '.0f')} | "
          f"{fmt(h_mean / float8, '.3f', 'x')} |")
nan = float("nan")
for m in models:
    figures = []
    for i, d in enumerate(dirs):
        amp, pure, h = load(d, f"peer-{m}-amp-bf16"), load(d, f"peer-{m}-pure-bf16"), load(d, f"hgrn-{m}")
        float8 = load(d, f"peer-{m}-float8-amp")
        get = lambda r, k: r[k] if r and k in r else nan
        f = [get(amp, "tokens_per_s"), get(pure, "tokens_per_s"), get(h, "tokens_per_s"), get(h, "tokens_per_s_mean"),
             get(amp, "peak_memory_gib"), get(h, "peak_memory_gib"), get(h, "mfu"), get(float8, "tokens_per_s")]
        figures.append(f)
        row(m, str(i + 1), *f)
    if len(dirs) > 1:
        row(m, "all", *[mean([f[k] for f in figures if not math.isnan(f[k])]) for k in range(8)])
PY
