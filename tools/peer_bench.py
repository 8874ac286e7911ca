#!/usr/bin/env python3
"""peer_bench.py: the peer's training step (PyTorch + flash-linear-attention's HGRN2ForCausalLM, or HGRNForCausalLM
with --model hgrn, GLAForCausalLM with --model gla, RetNetForCausalLM with --model retnet), timed the way
docs/benchmarks.md describes, so that hgrn and the peer can be measured in one run on one GPU.

Model: HGRN2Config(hidden_size, num_hidden_layers, expand_ratio=128, vocab_size=50304, fuse_cross_entropy=True,
fuse_norm=True, fuse_swiglu=True), all else fla's default; --model hgrn: HGRNConfig with the same fields and
expand_ratio=1 (fla's default; its training forward always takes chunk_hgrn); --model gla / retnet: GLAConfig /
RetNetConfig with the same fields but expand_ratio, all else fla's default (GLA: 4 heads, expand_k 0.5, expand_v 1,
hidden_ratio 4; RetNet: 8 heads, expand_k 1, expand_v 2, hidden_ratio 2; chunk mode for sequences past 64 tokens). Step: forward with labels = input_ids, backward,
clip_grad_norm_(1.0), fused AdamW(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), zero_grad; random token ids fixed
for the run. amp-bf16: fp32 parameters under torch.autocast(bfloat16); pure-bf16: parameters and optimiser state in
bf16; float8-amp: amp-bf16 with torchao's float8 training (convert_to_float8_training, its default recipe: per-tensor
current scaling) on every nn.Linear but the LM head whose sizes are multiples of 16, run eagerly like the other
modes (fla's fused SwiGLU calls down_proj's weight directly, so that GEMM stays bf16); needs torchao (its wheel in
FLA_WHEELS, scripts/peer_env.sh). 5 warm-up steps, then the mean of 20 timed steps (host clock after cuda.synchronize()); peak memory =
torch.cuda.max_memory_allocated() over the timed steps.

Usage: peer_bench.py [--model hgrn2|hgrn|gla|retnet] --layers 26 --hidden 1024 --batch 16 --seq 2048
                     --mode amp-bf16|pure-bf16|float8-amp [--json FILE]
"""
import argparse
import json
import time

import torch

from peer_models import fla_model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["hgrn2", "hgrn", "gla", "retnet"], default="hgrn2", help="fla's model_type")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--mode", choices=["amp-bf16", "pure-bf16", "float8-amp"], default="amp-bf16")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()

    torch.manual_seed(0)
    model = fla_model(a.model, a.layers, a.hidden, a.vocab).cuda()
    pure = a.mode == "pure-bf16"
    if pure:
        model = model.to(torch.bfloat16)
    if a.mode == "float8-amp":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(
            model,
            module_filter_fn=lambda module, fqn: fqn != "lm_head"
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0,
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not pure):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / a.steps
    params = sum(p.numel() for p in model.parameters())
    result = {"kind": "peer_training_step", "mode": a.mode, "layers": a.layers, "hidden": a.hidden,
              "batch": a.batch, "seq": a.seq, "params": params, "step_ms": step_s * 1e3,
              "tokens_per_s": a.batch * a.seq / step_s,
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "last_loss": loss.item(),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
