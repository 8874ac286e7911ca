#!/usr/bin/env bash
# gpu_generate_side_by_side.sh: generation with hgrn and with the peer (transformers' generate() on fla's model with
# its recurrent cache) on the same GPU in one run: `hgrn bench --generate` and tools/peer_generate_bench.py at each
# batch, prompt 512 and 256 new tokens (bf16, greedy, never stopping early), then hgrn again with 8192 new tokens to
# show its memory flat in the generated length; last a table of prefill and decode tokens/s, per-token latency, peak
# memory and the ratios the targets are stated in (docs/benchmarks.md). Needs torch (with CUDA) and transformers; fla
# and the peer's Triton cache come as scripts/peer_env.sh describes (FLA_WHEELS, PEER_CACHE_IN, PEER_CACHE_OUT,
# TRITON_CACHE_DIR). Builds build-gpu/hgrn when it is missing (scripts/gpu_build.sh).
# Usage: scripts/gpu_generate_side_by_side.sh [OUTPUT_DIR]   (default build-gpu/generate-side-by-side)
#   MODELS="hgrn2-385m hgrn2-1b" (or hgrn1-385m, ...)  BATCHES="1 64"  PROMPT=512  NEW_TOKENS=256  LONG_TOKENS=8192
#   (0: no long run)  RUNS=3 (timed generations per side)  PEER_MASKS="none" (add "ones" to also time the peer with
#   the attention mask generate() makes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/generate-side-by-side}
mkdir -p "$out"
source scripts/peer_env.sh
scripts/gpu_build.sh
{
  echo "commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python3 -c "import torch, transformers, fla; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fla', getattr(fla, '__version__', '?'))"
} | tee "$out/machine.txt"
prompt=${PROMPT:-512}
new_tokens=${NEW_TOKENS:-256}
long_tokens=${LONG_TOKENS:-8192}
runs=${RUNS:-3}
models=${MODELS:-hgrn2-385m hgrn2-1b}
batches=${BATCHES:-1 64}
masks=${PEER_MASKS:-none}
for model in $models; do
  read -r layers hidden _ model_type <<<"$(peer_shape "$model")"
  for batch in $batches; do
    for mask in $masks; do
      PYTHONUNBUFFERED=1 python3 tools/peer_generate_bench.py --model "$model_type" --layers "$layers" \
        --hidden "$hidden" --batch "$batch" --prompt-length "$prompt" --new-tokens "$new_tokens" \
        --attention-mask "$mask" --runs "$runs" --json "$out/peer-$model-b$batch-$mask.json" \
        > "$out/peer-$model-b$batch-$mask.txt" 2>&1 ||
        { echo "peer $model batch $batch ($mask) failed:"; tail -5 "$out/peer-$model-b$batch-$mask.txt"; }
    done
    ./build-gpu/hgrn bench --config "configs/$model.yaml" --generate --device cuda --dtype bf16 --batch "$batch" \
      --prompt-length "$prompt" --new-tokens "$new_tokens" --runs "$runs" --json "$out/hgrn-$model-b$batch.json" \
      > "$out/hgrn-$model-b$batch.txt" 2>&1 || { echo "hgrn $model batch $batch failed:"; tail -5 "$out/hgrn-$model-b$batch.txt"; }
    if [ "$long_tokens" -gt 0 ]; then
      ./build-gpu/hgrn bench --config "configs/$model.yaml" --generate --device cuda --dtype bf16 --batch "$batch" \
        --prompt-length "$prompt" --new-tokens "$long_tokens" --warmup 1 --runs 1 \
        --json "$out/hgrn-$model-b$batch-long.json" > "$out/hgrn-$model-b$batch-long.txt" 2>&1 ||
        { echo "hgrn $model batch $batch ($long_tokens tokens) failed:"; tail -5 "$out/hgrn-$model-b$batch-long.txt"; }
    fi
  done
done
python3 - "$out" "$masks" "$models" "$batches" <<'PY'
import json, math, os, sys
out, masks, models, batches = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
nan = float("nan")
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else {}
fmt = lambda x, spec: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)
# The peer's best over the attention-mask modes: its lowest latency and its highest rates.
print("| model | batch | peer prefill tok/s | hgrn prefill tok/s | peer ms/token | hgrn ms/token | peer / hgrn latency | "
      "peer decode tok/s | hgrn decode tok/s | hgrn / peer decode | hgrn floor ms | hgrn / floor | peer GiB | hgrn GiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    for b in batches:
        peers = [load(f"peer-{m}-b{b}-{mask}") for mask in masks]
        peers = [p for p in peers if p]
        h = load(f"hgrn-{m}-b{b}")
        pick = lambda key, best: best((p[key] for p in peers), default=nan)
        p_prefill, p_ms = pick("prefill_tokens_per_s", max), pick("ms_per_token", min)
        p_decode, p_gib = pick("decode_tokens_per_s", max), pick("peak_memory_gib", min)
        g = lambda key: h.get(key, nan)
        print(f"| {m} | {b} | {fmt(p_prefill, '.0f')} | {fmt(g('prefill_tokens_per_s'), '.0f')} | {fmt(p_ms, '.3f')} | "
              f"{fmt(g('ms_per_token'), '.3f')} | {fmt(p_ms / g('ms_per_token'), '.2f')}x | {fmt(p_decode, '.0f')} | "
              f"{fmt(g('decode_tokens_per_s'), '.0f')} | {fmt(g('decode_tokens_per_s') / p_decode, '.2f')}x | "
              f"{fmt(g('floor_ms'), '.3f')} | {fmt(g('ms_per_token') / g('floor_ms'), '.2f')}x | {fmt(p_gib, '.2f')} | "
              f"{fmt(g('peak_memory_gib'), '.2f')} |")
print()
print("| model | batch | new tokens | hgrn peak GiB | decode peak GiB | in use at decode start GiB | at its end GiB | "
      "driver allocations while decoding | ms/token |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    for b in batches:
        for suffix in ("", "-long"):
            h = load(f"hgrn-{m}-b{b}{suffix}")
            if not h:
                continue
            print(f"| {m} | {b} | {h['new_tokens']} | {h['peak_memory_gib']:.3f} | {h['decode_peak_memory_gib']:.3f} | "
                  f"{h['decode_start_memory_gib']:.3f} | {h['decode_end_memory_gib']:.3f} | "
                  f"{h['decode_driver_allocations']} | {h['ms_per_token']:.3f} |")
PY
