#!/usr/bin/env python3
"""peer_scan_bench.py: fla's HGRN recurrence alone (chunk_hgrn and fused_recurrent_hgrn), forward and
forward+backward, timed like `hgrn bench --scan B,T,C` for the side by side with hgrn's gated_scan.

Usage: peer_scan_bench.py [--batch 8] [--seq 2048] [--width 1024] [--iters 50] [--json FILE]

Inputs as fla's HGRN layer makes them under bf16 autocast: x and the log decay g in bf16 (g = logsigmoid of a
bf16 projection), random, g in (-inf, 0). Median of --iters CUDA-event-timed calls after 5 warm-ups.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn


def median_ms(fn, iters):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    torch.manual_seed(0)
    shape = (a.batch, a.seq, a.width)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = F.logsigmoid(torch.randn(shape, device="cuda") + 2).to(torch.bfloat16).detach().requires_grad_(True)
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    result = {"batch": a.batch, "seq": a.seq, "width": a.width}
    for name, op in (("chunk_hgrn", chunk_hgrn), ("fused_recurrent_hgrn", fused_recurrent_hgrn)):
        def forward():
            with torch.no_grad():
                op(x, g)

        def forward_backward():
            x.grad = g.grad = None
            o, _ = op(x, g)
            o.backward(do)

        result[name] = {"forward_ms": median_ms(forward, a.iters),
                        "forward_backward_ms": median_ms(forward_backward, a.iters)}
        print(f"{name}: B={a.batch} T={a.seq} D={a.width} bf16 | forward {result[name]['forward_ms']:.3f} ms | "
              f"forward+backward {result[name]['forward_backward_ms']:.3f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
