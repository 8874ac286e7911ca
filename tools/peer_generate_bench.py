#!/usr/bin/env python3
"""peer_generate_bench.py: the peer's generation -- transformers' generate() on flash-linear-attention's
HGRN2ForCausalLM (or HGRNForCausalLM with --model hgrn) with its recurrent cache -- timed as `hgrn bench --generate`
times hgrn's, so that both can be measured in one run on one GPU (scripts/gpu_generate_side_by_side.sh).

Model: HGRN2Config(hidden_size, num_hidden_layers, expand_ratio=128, vocab_size=50304, fuse_norm=True,
fuse_swiglu=True), all else fla's default; --model hgrn: HGRNConfig with expand_ratio=1 (fla's default). Random
weights (fla's initialisation after torch.manual_seed(0)), parameters in bf16, eval mode, under
torch.inference_mode().

Generation: model.generate(input_ids, max_new_tokens=N, min_new_tokens=N, do_sample=False, use_cache=True) on a
random prompt [batch, prompt_length]: greedy, and never stopping early (min_new_tokens keeps the end-of-text token
out).

Timing (host clock around torch.cuda.synchronize()): a generation of N new tokens is the prompt's forward with the
first token, then N - 1 decode steps. So T(1), a generation of one new token, is the prefill (prefill tokens/s =
batch * prompt_length / T(1)), and the decode steps take T(N) - T(1): per-token latency (T(N) - T(1)) / (N - 1),
decode tokens/s batch * (N - 1) / (T(N) - T(1)). T(1) and T(N) are each the median of --runs timed calls after
--warmup untimed ones of each (fla compiles and autotunes its Triton kernels on first use). Peak memory:
torch.cuda.max_memory_allocated() over the timed N-token generations.

--attention-mask none (the default) gives the model no attention mask: generate() makes one of all ones (there is no
padding here), and given one, fla's layers unpad and pad again the hidden states at every step, which only slows the
peer down; `ones` keeps it, as a call with a tokenizer's mask runs.

Usage: peer_generate_bench.py [--model hgrn2|hgrn] --layers 26 --hidden 1024 --batch 1 [--prompt-length 512]
       [--new-tokens 256] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
import transformers

from peer_models import fla_model


def make_model(a):
    torch.manual_seed(0)
    model = fla_model(a.model, a.layers, a.hidden, a.vocab)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    if a.attention_mask == "none":
        prepare = model.prepare_inputs_for_generation

        def without_mask(*args, **kwargs):
            inputs = prepare(*args, **kwargs)
            inputs["attention_mask"] = None
            return inputs

        model.prepare_inputs_for_generation = without_mask
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["hgrn2", "hgrn"], default="hgrn2", help="fla's model_type")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--prompt-length", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--attention-mask", choices=["none", "ones"], default="none")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    if a.new_tokens < 2:
        p.error("--new-tokens: at least 2 (the decode steps are those after the first new token)")

    model = make_model(a)
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt_length), device="cuda")
    eos = model.config.eos_token_id

    def generation(new_tokens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             use_cache=True, pad_token_id=eos, eos_token_id=eos)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        assert out.shape == (a.batch, a.prompt_length + new_tokens), f"generated {tuple(out.shape)}"
        return seconds

    with torch.inference_mode():
        for _ in range(a.warmup):
            generation(1)
            generation(a.new_tokens)
        prefill_s = statistics.median(generation(1) for _ in range(a.runs))
        torch.cuda.reset_peak_memory_stats()
        whole_s = statistics.median(generation(a.new_tokens) for _ in range(a.runs))
    decode_s = whole_s - prefill_s
    steps = a.new_tokens - 1
    result = {"kind": "peer_generation", "model": a.model, "layers": a.layers, "hidden": a.hidden,
              "batch": a.batch, "prompt_length": a.prompt_length, "new_tokens": a.new_tokens,
              "attention_mask": a.attention_mask, "params": sum(p.numel() for p in model.parameters()),
              "prefill_ms": prefill_s * 1e3, "prefill_tokens_per_s": a.batch * a.prompt_length / prefill_s,
              "generation_ms": whole_s * 1e3, "ms_per_token": decode_s / steps * 1e3,
              "decode_tokens_per_s": a.batch * steps / decode_s,
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "transformers": transformers.__version__}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
