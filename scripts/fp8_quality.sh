#!/usr/bin/env bash
# fp8_quality.sh: does FP8 training keep bf16's quality? hgrn2-150m (or CONFIG's model) on WikiText-2 (GPT-2
# tokenizer) trained twice from the same initial weights on the same batches (one seed), in bf16 and with
# training.precision fp8, then evaluated on the test split; prints the largest relative gap between the two
# training-loss curves and how many logged steps lie more than 1% apart, the held-out losses and the test
# perplexities, and draws both runs (tools/plot_runs.py).
#
#   scripts/fp8_quality.sh [OUT_DIR]          (default runs/fp8-quality)
#
# Environment: DATA (data/wikitext-2-gpt2/wiki: the prefix of the prepared splits, see configs/wikitext2-gpt2.yaml),
# STEPS (2000), BATCH (8) x SEQ (512) tokens a step (about four epochs of WikiText-2 in 2,000 steps), LR (1e-3),
# GPUS ("0 1": the two runs side by side on these GPUs; one GPU runs them one after the other), HGRN (build/hgrn),
# FP8_SET (space-separated --set options for the fp8 run alone, e.g. "training.fp8_lm_head=true"), CONFIG
# (configs/hgrn2-150m.yaml: the model, its memory settings and optimiser; the data and schedule are set here).
# The gap is measured from step 100 on (both runs' first steps are dominated by the warm-up and FP8's first step
# runs at scale 1, before any amax history exists), over the logged steps.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/fp8-quality}
data=${DATA:-data/wikitext-2-gpt2/wiki}
hgrn=${HGRN:-build/hgrn}
config=${CONFIG:-configs/hgrn2-150m.yaml}
[ -f "$config" ] || { echo "fp8_quality: CONFIG $config not found" >&2; exit 1; }
read -ra gpus <<< "${GPUS:-0 1}"
[ -x "$hgrn" ] || { echo "fp8_quality: $hgrn not found: build first (scripts/setup.sh) or set HGRN" >&2; exit 1; }
for split in train valid test; do
  [ -e "${data}_$split.bin" ] ||
    { echo "fp8_quality: no ${data}_$split shard: prepare WikiText-2 as configs/wikitext2-gpt2.yaml says" >&2; exit 1; }
done
mkdir -p "$out"
fp8_set=()
for option in ${FP8_SET:-}; do fp8_set+=(--set "$option"); done
run() {  # precision gpu
  local extra=()
  if [ "$1" = fp8 ]; then extra=(${fp8_set[@]+"${fp8_set[@]}"}); fi
  CUDA_VISIBLE_DEVICES=$2 "$hgrn" train --config "$config" --set data.task=tokens \
    --set data.train_data="${data}_train" --set data.valid_data="${data}_valid" --set data.seq_len="${SEQ:-512}" \
    --set training.micro_batch_size="${BATCH:-8}" --set training.max_steps="${STEPS:-2000}" \
    --set training.warmup_steps=100 --set training.lr="${LR:-1e-3}" --set training.deterministic=true \
    --set training.precision="$1" --set training.eval_interval=250 --set training.eval_batches=16 \
    --set checkpoint.interval="${STEPS:-2000}" --set logging.log_interval=10 --set logging.run_dir="$out/$1" \
    ${extra[@]+"${extra[@]}"} > "$out/$1.log" 2>&1
  CUDA_VISIBLE_DEVICES=$2 "$hgrn" eval --config "$out/$1/config.yaml" --data "${data}_test" >> "$out/$1.log" 2>&1
  echo "fp8_quality: $1 done ($out/$1.log)"
}
if [ ${#gpus[@]} -ge 2 ]; then
  run bf16 "${gpus[0]}" & run fp8 "${gpus[1]}" & wait
else
  run bf16 "${gpus[0]}"; run fp8 "${gpus[0]}"
fi
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def records(precision, kind):
    with open(f"{out}/{precision}/metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f)) if r.get("kind") == kind}
train = {p: records(p, "train") for p in ("bf16", "fp8")}
steps = sorted(s for s in train["bf16"] if s in train["fp8"] and s >= 100)
worst = max(steps, key=lambda s: abs(train["fp8"][s] / train["bf16"][s] - 1))
print(f"largest training-loss gap from step 100 on: {100 * (train['fp8'][worst] / train['bf16'][worst] - 1):+.2f}% "
      f"at step {worst} (bf16 {train['bf16'][worst]:.4f}, fp8 {train['fp8'][worst]:.4f}; {len(steps)} logged steps)")
apart = [s for s in steps if abs(train["fp8"][s] / train["bf16"][s] - 1) > 0.01]
print(f"logged steps more than 1% apart: {len(apart)} of {len(steps)}" +
      (f" (steps {apart[0]} to {apart[-1]})" if apart else ""))
held = {p: records(p, "eval") for p in ("bf16", "fp8")}
last = max(held["bf16"])
print(f"held-out loss at step {last}: bf16 {held['bf16'][last]:.4f}, fp8 {held['fp8'][last]:.4f} "
      f"({100 * (held['fp8'][last] / held['bf16'][last] - 1):+.2f}%)")
PY
grep -H "perplexity" "$out/bf16.log" "$out/fp8.log" || true
python3 tools/plot_runs.py "$out/bf16" "$out/fp8" -o "$out/fp8-vs-bf16.png"
