#!/usr/bin/env python3
"""projection_fusion_bench.py: would fusing HGRN2's projections pay? Times, with torch's cuBLAS on the GPU at hand,
the GEMMs of one layer's q/f/i projections (three [D, D] weights) and of the MLP's gate/up projections (two [I, D]
weights) as separate GEMMs and as one GEMM over the stacked weight: forward y = x·Wᵀ, the input gradient (separate:
one GEMM, then beta = 1 accumulations; fused: one GEMM with K = the stacked width) and the weight gradient. bf16
operands; the best of 20 CUDA-event-timed calls after 3 warm-ups. The shapes are hgrn2-385m's (32768 tokens, D 1024,
I 2816) and hgrn2-1b's (16384 tokens, D 2048, I 5632). A rough guide (torch's heuristic algorithms, not hgrn's
autotuned ones), for docs/benchmarks.md.

Usage: projection_fusion_bench.py
"""
import torch


def best_us(fn, reps=20):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best * 1e3


def main():
    bf16 = torch.bfloat16
    for tokens, d, inner in ((32768, 1024, 2816), (16384, 2048, 5632)):
        x = torch.randn(tokens, d, device="cuda", dtype=bf16)
        dx = torch.empty(tokens, d, device="cuda", dtype=bf16)
        for name, widths in (("q/f/i", [d, d, d]), ("gate/up", [inner, inner])):
            weights = [torch.randn(w, d, device="cuda", dtype=bf16) * 0.02 for w in widths]
            stacked = torch.cat(weights, 0)
            grads = [torch.randn(tokens, w, device="cuda", dtype=bf16) for w in widths]
            grads_stacked = torch.cat(grads, 1)
            outs = [torch.empty(tokens, w, device="cuda", dtype=bf16) for w in widths]
            out_stacked = torch.empty(tokens, sum(widths), device="cuda", dtype=bf16)

            def forward_separate():
                for w, y in zip(weights, outs):
                    torch.mm(x, w.t(), out=y)

            def input_grad_separate():
                torch.mm(grads[0], weights[0], out=dx)
                for g, w in zip(grads[1:], weights[1:]):
                    torch.addmm(dx, g, w, out=dx)

            def weight_grad_separate():
                for g in grads:
                    torch.mm(g.t(), x)

            cases = (
                ("forward, separate", forward_separate),
                ("forward, fused", lambda: torch.mm(x, stacked.t(), out=out_stacked)),
                ("input gradient, separate (beta 1)", input_grad_separate),
                ("input gradient, fused", lambda: torch.mm(grads_stacked, stacked, out=dx)),
                ("weight gradient, separate", weight_grad_separate),
                ("weight gradient, fused", lambda: torch.mm(grads_stacked.t(), x)),
            )
            flops = 2 * tokens * d * sum(widths)
            for label, fn in cases:
                us = best_us(fn)
                print(f"tokens {tokens} D {d} {name:8s} {label:34s} {us:8.1f} us {flops / us / 1e6:6.0f} TFLOP/s",
                      flush=True)


if __name__ == "__main__":
    main()
