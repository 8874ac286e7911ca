#!/usr/bin/env bash
# gpu_loss_parity.sh: does hgrn train like the peer? One GPU, one run: the peer's freshly initialised model
# (tools/peer_parity.py init) is trained for STEPS steps by hgrn (`hgrn train` with checkpoint.init_from, twice: with
# training.deterministic false and true, whose different GEMM algorithms show what rounding alone moves the loss) and
# by the peer (tools/peer_parity.py train, PEER_MODES), on the same token shard read in the same order
# (data.shuffle: false), with the same schedule, decay groups, clipping and batch; then the losses step by step
# (tools/peer_parity.py compare). The model's shape, batch and optimiser settings are the config's; sequences are
# SEQ tokens long on the peer's side (SEQ - 1 targets, hgrn's data.seq_len), so that fla sees the shapes whose Triton
# kernels the side by side compiled. Needs what gpu_side_by_side.sh needs (scripts/peer_env.sh).
# Usage: scripts/gpu_loss_parity.sh SHARD_PREFIX [OUTPUT_DIR]   (default build-gpu/loss-parity)
#   SHARD_PREFIX: a training shard from `hgrn prepare` whose vocabulary fits the model (e.g. WikiText-2 with the GPT-2
#   tokenizer: README, "Data").  MODEL=hgrn2-150m  STEPS=300  WARMUP=30  SEQ=2048  PEER_MODES="amp-bf16 pure-bf16"
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/gpu_loss_parity.sh SHARD_PREFIX [OUTPUT_DIR]}
out=${2:-build-gpu/loss-parity}
[ -f "$prefix.bin" ] && [ -f "$prefix.idx" ] ||
  { echo "gpu_loss_parity.sh: no shard at $prefix (.bin and .idx): prepare one with hgrn prepare" >&2; exit 1; }
model=${MODEL:-hgrn2-150m}
steps=${STEPS:-300}
warmup=${WARMUP:-30}
seq=${SEQ:-2048}
config=configs/$model.yaml
mkdir -p "$out"
source scripts/peer_env.sh
read -r layers hidden batch model_type <<<"$(peer_shape "$model")"
scripts/gpu_build.sh
value() { awk -v key="$1:" '$1 == key { print $2; exit }' "$config"; }  # a top-level training key of the config
lr=$(value lr)
min_lr_ratio=$(value min_lr_ratio)
weight_decay=$(value weight_decay)
grad_clip=$(value grad_clip)
{
  echo "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python3 -c "import torch, fla; print('torch', torch.__version__, 'fla', getattr(fla, '__version__', '?'))"
  echo "$model ($layers x $hidden), batch $batch x $seq tokens, $steps steps (warm-up $warmup), lr $lr," \
    "min_lr_ratio $min_lr_ratio, weight decay $weight_decay, clip $grad_clip, shard $prefix"
} | tee "$out/machine.txt"

rm -rf "$out/init"
python3 tools/peer_parity.py init --model-type "$model_type" --layers "$layers" --hidden "$hidden" --out "$out/init"
runs=()
for deterministic in false true; do
  run_dir=$out/hgrn-deterministic-$deterministic
  rm -rf "$run_dir"
  ./build-gpu/hgrn train --config "$config" --set data.task=tokens --set "data.train_data=$prefix" \
    --set data.shuffle=false --set "data.seq_len=$((seq - 1))" --set "checkpoint.init_from=$out/init" \
    --set checkpoint.resume=never --set "training.max_steps=$steps" --set "training.warmup_steps=$warmup" \
    --set "training.deterministic=$deterministic" --set training.eval_interval=0 --set logging.log_interval=1 \
    --set "logging.run_dir=$run_dir" > "$out/hgrn-deterministic-$deterministic.txt" 2>&1 ||
    { echo "hgrn (deterministic $deterministic) failed:"; tail -5 "$out/hgrn-deterministic-$deterministic.txt"; exit 1; }
  rm -rf "$run_dir/checkpoints"  # the final checkpoint (2-5 GB) is not needed here
  runs+=(--run "hgrn-det-$deterministic=$run_dir/metrics.jsonl")
done
for mode in ${PEER_MODES:-amp-bf16 pure-bf16}; do
  PYTHONUNBUFFERED=1 python3 tools/peer_parity.py train --model "$out/init" --data "$prefix" --batch "$batch" \
    --seq "$((seq - 1))" --steps "$steps" --warmup "$warmup" --lr "$lr" --min-lr-ratio "$min_lr_ratio" \
    --weight-decay "$weight_decay" --grad-clip "$grad_clip" --mode "$mode" --out "$out/peer-$mode.json" \
    > "$out/peer-$mode.txt" 2>&1 || { echo "peer $mode failed:"; tail -5 "$out/peer-$mode.txt"; exit 1; }
  runs+=(--run "peer-$mode=$out/peer-$mode.json")
done
python3 tools/peer_parity.py compare "${runs[@]}" --json "$out/parity.json" | tee "$out/parity.md"
