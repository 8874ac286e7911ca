#!/usr/bin/env bash
# mqar_sweep.sh: the HGRN2 paper's MQAR comparison (section 4.1, Fig. 3): HGRN2 and HGRN1 (and, with MODELS, GLA
# and RetNet, the paper's other recurrent baselines) trained on the built-in
# multi-query associative recall task over model dimensions x sequence lengths, each cell with a small learning-rate
# sweep; then tools/mqar_figure.py draws accuracy against model dimension (one panel per sequence length) and writes
# the table.
#
#   scripts/mqar_sweep.sh [OUT_DIR]          (default runs/mqar-sweep)
#
# The setting (Zoology's MQAR, as the paper): vocabulary 8192 (keys from one half, values from the other), 2 layers,
# key-value pairs 4, 8, 16, 64 at sequence lengths 64, 128, 256, 512, batches of 256, 128, 64, 32 sequences (the same
# tokens per step); HGRN2 with expand_ratio 64 (heads of key width 64), HGRN1 with expand_ratio 1, GLA and RetNet with
# fla's expand_k and expand_v and D / 64 heads (values 64 wide a head for GLA, 128 for RetNet); AdamW with a cosine
# schedule, 5% warm-up and no weight decay (as configs/mqar-tiny.yaml, the base of every run). A cell's accuracy is the held-out accuracy of its best learning rate at the end of training.
# Environment: MODELS ("hgrn2 hgrn"; MODELS="hgrn2 hgrn gla retnet" for the four), DIMS ("64 128 256 512"),
# SEQS ("64 128 256 512"), LRS ("5e-4 1e-3 5e-3"), STEPS (3000), EVAL_BATCHES (16), EVALS (evaluations per run, 1: at
# the end), CHECKPOINTS (checkpoints per run, 1: at the end), GPUS (how many GPUs; 0 = CPU; the runs go to the GPUs that
# CUDA_VISIBLE_DEVICES lists, else to GPUs 0 .. GPUS-1), JOBS_PER_GPU (1: a
# second run on one GPU does not add throughput), HGRN (build/hgrn).
# The sequence layout (docs/mqar.md): PLACEMENT (uniform, hgrn's; power_law, Zoology's), POWER_A (0.01, with
# power_law), FILLER (zero; random), TRAIN_SEQUENCES (0: fresh sequences; 100000: Zoology's fixed training set).
# Zoology's layout: PLACEMENT=power_law TRAIN_SEQUENCES=100000; use another OUT_DIR than a uniform sweep's.
# A run already finished in OUT_DIR is not trained again and an interrupted one continues from its last checkpoint
# (checkpoint.resume: auto), so the script can be re-run to fill in cells. The costliest runs start first.
# Progress: one line per finished run with the running count and an ETA.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-runs/mqar-sweep}
hgrn=${HGRN:-build/hgrn}
models=${MODELS:-"hgrn2 hgrn"}
dims=${DIMS:-"64 128 256 512"}
seqs=${SEQS:-"64 128 256 512"}
lrs=${LRS:-"5e-4 1e-3 5e-3"}
steps=${STEPS:-3000}
eval_batches=${EVAL_BATCHES:-16}
evals=${EVALS:-1}
checkpoints=${CHECKPOINTS:-1}
jobs_per_gpu=${JOBS_PER_GPU:-1}
placement=${PLACEMENT:-uniform}
power_a=${POWER_A:-0.01}
filler=${FILLER:-zero}
train_sequences=${TRAIN_SEQUENCES:-0}
# The layout keys only where they differ from the defaults, so a uniform sweep's runs keep their configs.
layout=()
[ "$placement" = uniform ] || layout+=(--set data.mqar.query_placement="$placement" --set data.mqar.power_a="$power_a")
[ "$filler" = zero ] || layout+=(--set data.mqar.filler="$filler")
[ "$train_sequences" = 0 ] || layout+=(--set data.mqar.num_train_sequences="$train_sequences")
gpu_ids=()
[ -z "${CUDA_VISIBLE_DEVICES:-}" ] || IFS=, read -ra gpu_ids <<< "$CUDA_VISIBLE_DEVICES"
if [ -z "${GPUS:-}" ]; then
  if [ ${#gpu_ids[@]} -gt 0 ]; then GPUS=${#gpu_ids[@]}; else GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || echo 0); fi
fi
[ ${#gpu_ids[@]} -ge "$GPUS" ] || gpu_ids=($(seq 0 $((GPUS - 1))))
[ -x "$hgrn" ] || { echo "mqar_sweep: $hgrn not found: build first (scripts/setup.sh) or set HGRN" >&2; exit 1; }
mkdir -p "$out/logs"

kv_pairs() { case $1 in 64) echo 4 ;; 128) echo 8 ;; 256) echo 16 ;; 512) echo 64 ;; *) echo $(($1 / 8)) ;; esac; }
batch() { echo $((16384 / $1)); }

jobs=()
descending() { tr ' ' '\n' <<< "$1" | sort -rn | tr '\n' ' '; }
for t in $(descending "$seqs"); do
  for d in $(descending "$dims"); do
    for model in $models; do
      for lr in $lrs; do jobs+=("$model $d $t $lr"); done
    done
  done
done
total=${#jobs[@]}
slots=$(( GPUS > 0 ? GPUS * jobs_per_gpu : 1 ))
echo "mqar_sweep: $total runs ($models; D in $dims; T in $seqs; lr in $lrs; $steps steps;" \
     "placement $placement, filler $filler, $([ "$train_sequences" = 0 ] && echo "fresh sequences" ||
       echo "$train_sequences fixed sequences")) on" \
     "$([ "$GPUS" -gt 0 ] && echo "$GPUS GPU(s), $jobs_per_gpu at a time each" || echo "the CPU") into $out"

run_one() {  # model d t lr slot
  local model=$1 d=$2 t=$3 lr=$4 slot=$5
  local name="$model-d$d-t$t-lr$lr" device=cpu precision=fp32
  local shape=(--set model.expand_ratio=64)
  case $model in
    hgrn) shape=(--set model.expand_ratio=1) ;;
    gla | retnet) shape=(--set model.expand_ratio=null --set model.num_heads=$(( d > 64 ? d / 64 : 1 ))) ;;
  esac
  local env=()
  if [ "$GPUS" -gt 0 ]; then device=cuda; precision=bf16; env=(CUDA_VISIBLE_DEVICES="${gpu_ids[$((slot % GPUS))]}"); fi
  env "${env[@]}" "$hgrn" train --config configs/mqar-tiny.yaml \
    --set model.type="$model" --set model.hidden_size="$d" "${shape[@]}" \
    --set model.vocab_size=8192 --set data.seq_len="$t" --set data.mqar.num_kv_pairs="$(kv_pairs "$t")" \
    ${layout[@]+"${layout[@]}"} \
    --set training.device="$device" --set training.precision="$precision" \
    --set training.micro_batch_size="$(batch "$t")" --set training.lr="$lr" --set training.max_steps="$steps" \
    --set training.warmup_steps=$((steps / 20)) \
    --set training.eval_interval=$((steps / evals)) --set training.eval_batches="$eval_batches" \
    --set checkpoint.interval=$((steps / checkpoints)) \
    --set logging.log_interval=$((steps / 10)) --set logging.run_dir="$out/$name" \
    > "$out/logs/$name.log" 2>&1
}

start=$(date +%s)
done_count=0
for i in "${!jobs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$slots" ]; do wait -n || true; done
  # shellcheck disable=SC2086
  ( set -- ${jobs[$i]}
    if run_one "$1" "$2" "$3" "$4" "$i"; then status=ok; else status="FAILED (see $out/logs/$1-d$2-t$3-lr$4.log)"; fi
    echo "  $1 D=$2 T=$3 lr=$4: $status" ) &
  done_count=$((i + 1))
  elapsed=$(( $(date +%s) - start ))
  if [ "$done_count" -gt "$slots" ]; then
    started_done=$((done_count - slots))
    echo "mqar_sweep: $done_count/$total started, ${elapsed}s elapsed, ETA ~$(( elapsed * (total - started_done) / started_done ))s"
  fi
done
wait
echo "mqar_sweep: all $total runs ended in $(( $(date +%s) - start ))s"
python3 tools/mqar_figure.py "$out" -o "$out/mqar.png" --table "$out/mqar.md"
