#!/usr/bin/env python3
"""peer_parity.py: does hgrn train like the peer (PyTorch + flash-linear-attention)? The same model from the same
initial weights on the same batches, with the same optimiser and schedule, step by step; scripts/gpu_loss_parity.sh
runs the whole comparison on one GPU.

  init:    an fla model (HGRN2ForCausalLM, or with --model-type that type's: the peer_bench.py config) with fla's own
           initialisation, saved as a Hugging Face directory (fp32 safetensors) that
           `hgrn train --set checkpoint.init_from=DIR` starts from.
  train:   the peer trains that model on a token shard from `hgrn prepare`, reading the windows in the order hgrn
           reads them with data.shuffle: false (step s takes windows sB .. sB + B - 1 modulo W = floor((N - 1) / T);
           window w is tokens [wT, wT + T + 1)), with hgrn's learning-rate schedule (src/train/schedule.cpp: linear
           warm-up, cosine to min_lr_ratio), hgrn's decay groups (src/train/optimizer.cpp: no decay on norms, the lower
           bounds and, by default, the embeddings), AdamW(betas 0.9/0.95, eps 1e-8) and global-norm clipping; one loss a
           step into a JSON file.
  compare: hgrn's metrics.jsonl files (logging.log_interval: 1) against the peer's losses, step by step, and their
           gradient norms; stops if the runs' learning rates differ (the schedule above drifted from hgrn's).

The loss is the mean next-token cross-entropy over the B x T targets of each step on both sides: the peer gets the
window's T + 1 tokens as input_ids and labels (fla shifts the labels and ignores the last position), so that it scores
exactly the T targets hgrn scores (the extra input position only produces the ignored prediction).
"""
import argparse
import json
import math
import sys

import numpy as np

from peer_models import fla_model


def cmd_init(a):
    import torch
    torch.manual_seed(a.seed)
    model = fla_model(a.model_type, a.layers, a.hidden, a.vocab)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"peer_parity init: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {a.out}")


def read_shard(prefix):
    """The token ids of PREFIX.bin, typed by PREFIX.idx's dtype code (Megatron's: 8 uint16, 4 int32)."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(18)
    if header[:9] != b"MMIDIDX\x00\x00":
        sys.exit(f"peer_parity: {prefix}.idx is not an indexed-dataset index (hgrn prepare writes them)")
    dtypes = {8: np.uint16, 4: np.int32}
    if header[17] not in dtypes:
        sys.exit(f"peer_parity: {prefix}.idx has dtype code {header[17]}; expected 8 (uint16) or 4 (int32)")
    return np.fromfile(prefix + ".bin", dtype=dtypes[header[17]])


def learning_rate(step, lr, warmup, max_steps, min_lr_ratio):
    """src/train/schedule.cpp's cosine schedule (step counts from 0)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = min_lr_ratio * lr
    p = 1.0 if max_steps <= warmup else min(max((step - warmup) / (max_steps - warmup), 0.0), 1.0)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def cmd_train(a):
    import torch
    import fla  # noqa: F401  (registers fla's configs and models with the Auto classes)
    from transformers import AutoModelForCausalLM
    tokens = read_shard(a.data)
    T, B = a.seq, a.batch
    windows = (len(tokens) - 1) // T
    if windows < 1:
        sys.exit(f"peer_parity: {a.data} has {len(tokens)} tokens, fewer than one window of {T + 1}")
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).cuda()
    pure = a.mode == "pure-bf16"
    if pure:
        model = model.to(torch.bfloat16)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if "lower_bounds" in name or p.ndim < 2 or ("embeddings" in name and not a.decay_embeddings):
            no_decay.append(p)
        else:
            decay.append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    losses, lrs, grad_norms = [], [], []
    for step in range(a.steps):
        rows = [(step * B + i) % windows for i in range(B)]
        batch = np.stack([tokens[w * T: w * T + T + 1] for w in rows]).astype(np.int64)
        ids = torch.from_numpy(batch).cuda()
        lr = learning_rate(step, a.lr, a.warmup, a.steps, a.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not pure):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        lrs.append(lr)
        grad_norms.append(grad_norm.item())
        if step % 50 == 0 or step + 1 == a.steps:
            print(f"peer_parity train ({a.mode}): step {step + 1}/{a.steps} loss {losses[-1]:.4f} "
                  f"grad norm {grad_norm.item():.3f} lr {lr:.3e}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"kind": "peer_losses", "mode": a.mode, "losses": losses, "lr": lrs, "grad_norm": grad_norms,
                   "batch": B, "seq": T,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f)


def hgrn_run(path):
    """Per-step loss, learning rate and gradient norm from hgrn's metrics.jsonl (logging.log_interval: 1)."""
    records = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == "train":
                records[int(record["step"])] = record
    steps = sorted(records)
    if not steps or steps != list(range(1, len(steps) + 1)):
        sys.exit(f"peer_parity: {path} does not hold one training record per step from step 1 (log_interval must be 1)")
    return {key: [float(records[s][key]) for s in steps] for key in ("loss", "lr", "grad_norm")}


def peer_run(path):
    d = json.load(open(path))
    return {"loss": d["losses"], "lr": d.get("lr"), "grad_norm": d.get("grad_norm")}


def table(runs, key, steps, every, fmt):
    names = [n for n in runs if runs[n].get(key)]
    print("| step | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for s in sorted(set([0, 1, 4, 9] + list(range(every - 1, steps, every)) + [steps - 1])):
        print(f"| {s + 1} | " + " | ".join(format(runs[n][key][s], fmt) for n in names) + " |")


def cmd_compare(a):
    all_runs = {}
    for spec in a.run:
        name, _, path = spec.partition("=")
        if not path:
            sys.exit(f"peer_parity compare: --run wants NAME=FILE, got '{spec}'")
        all_runs[name] = hgrn_run(path) if path.endswith(".jsonl") else peer_run(path)
    steps = min(len(r["loss"]) for r in all_runs.values())
    # The runs must have followed one learning-rate schedule (hgrn's, which the peer script re-implements): a
    # difference here would make the loss comparison meaningless, so it stops the comparison.
    with_lr = [n for n in all_runs if all_runs[n].get("lr")]
    for n in with_lr[1:]:
        for s in range(steps):
            x, y = all_runs[with_lr[0]]["lr"][s], all_runs[n]["lr"][s]
            if abs(x - y) > 1e-5 * max(abs(x), abs(y)):
                sys.exit(f"peer_parity compare: the learning rates differ at step {s + 1}: {with_lr[0]} {x:.6g}, "
                         f"{n} {y:.6g} (the peer script's schedule no longer matches hgrn's)")
    print(f"learning rates: the same schedule in {', '.join(with_lr)} (within 1e-5 relative, hgrn logs 6 digits)\n")
    table(all_runs, "loss", steps, a.every, ".4f")
    print("\nGradient norms before clipping:")
    table(all_runs, "grad_norm", steps, a.every, ".4f")
    runs = {n: r["loss"] for n, r in all_runs.items()}
    names = list(runs)
    tail = slice(max(0, steps - a.tail), steps)
    print(f"\nDifferences over steps 1-{steps} and the last {a.tail} (mean |a - b|, max |a - b|, mean a - b):")
    result = {"steps": steps, "tail": a.tail, "pairs": {}}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            d = np.array(runs[x][:steps]) - np.array(runs[y][:steps])
            stats = {"mean_abs": float(np.abs(d).mean()), "max_abs": float(np.abs(d).max()),
                     "tail_mean_abs": float(np.abs(d[tail]).mean()), "tail_mean": float(d[tail].mean())}
            gx, gy = all_runs[x].get("grad_norm"), all_runs[y].get("grad_norm")
            if gx and gy:  # relative to the pair's mean norm, step by step
                gx, gy = np.array(gx[:steps]), np.array(gy[:steps])
                stats["grad_norm_mean_rel"] = float((np.abs(gx - gy) / (0.5 * (gx + gy))).mean())
            result["pairs"][f"{x} - {y}"] = stats
            print(f"  {x} - {y}: all {stats['mean_abs']:.4f} / {stats['max_abs']:.4f}; last {a.tail}: "
                  f"{stats['tail_mean_abs']:.4f} / {float(np.abs(d[tail]).max()):.4f} / {stats['tail_mean']:+.4f}" +
                  (f"; gradient norms {100 * stats['grad_norm_mean_rel']:.2f}% apart on average"
                   if "grad_norm_mean_rel" in stats else ""))
    print(f"\nMean loss over the last {a.tail} steps: " +
          ", ".join(f"{n} {np.mean(runs[n][tail]):.4f}" for n in names))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init", help="save fla's freshly initialised model")
    i.add_argument("--model-type", choices=["hgrn2", "hgrn", "gla", "retnet"], default="hgrn2",
                   help="fla's model_type (default %(default)s)")
    i.add_argument("--layers", type=int, required=True)
    i.add_argument("--hidden", type=int, required=True)
    i.add_argument("--vocab", type=int, default=50304)
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--out", required=True)
    t = sub.add_parser("train", help="train the peer on a shard, one loss a step")
    t.add_argument("--model", required=True, help="the init directory")
    t.add_argument("--data", required=True, help="shard prefix (PREFIX.bin, PREFIX.idx)")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, default=2048)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--min-lr-ratio", type=float, default=0.1)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--decay-embeddings", action="store_true")
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--mode", choices=["amp-bf16", "pure-bf16"], default="amp-bf16")
    t.add_argument("--out", required=True, help="losses JSON")
    c = sub.add_parser("compare", help="step-by-step losses of several runs")
    c.add_argument("--run", action="append", required=True,
                   help="NAME=FILE: an hgrn metrics.jsonl or a peer losses JSON (repeat)")
    c.add_argument("--every", type=int, default=25, help="table rows every N steps")
    c.add_argument("--tail", type=int, default=50, help="steps at the end summarised separately")
    c.add_argument("--json", help="also write the differences here")
    a = p.parse_args()
    {"init": cmd_init, "train": cmd_train, "compare": cmd_compare}[a.command](a)


if __name__ == "__main__":
    main()
