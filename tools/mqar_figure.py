#!/usr/bin/env python3
"""mqar_figure.py: the MQAR comparison of scripts/mqar_sweep.sh as a figure and a table.

Usage: python3 tools/mqar_figure.py SWEEP_DIR [-o FIGURE.png] [--table TABLE.md]

Reads SWEEP_DIR/<model>-d<D>-t<T>-lr<LR>/metrics.jsonl (the last held-out evaluation of each run), keeps each
cell's best learning rate, and draws accuracy against model dimension, one panel per sequence length, one line per
model (as the HGRN2 paper's Fig. 3). The table lists every cell's best accuracy and its learning rate; runs that did
not finish are named on stderr.
"""

import argparse
import json
import os
import re
import sys

NAMES = {"hgrn2": "HGRN2", "hgrn": "HGRN1", "gla": "GLA", "retnet": "RetNet"}
RUN = re.compile(r"^(?P<model>[a-z0-9]+)-d(?P<d>\d+)-t(?P<t>\d+)-lr(?P<lr>[0-9.e+-]+)$")


def last_eval(path):
    """The last evaluation record of a metrics.jsonl, or None."""
    last = None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not a JSON object ({e.msg})")
            if record.get("kind") == "eval":
                last = record
    return last


def collect(sweep_dir):
    best = {}  # (model, t, d) -> (accuracy, lr, step)
    unfinished = []
    for name in sorted(os.listdir(sweep_dir)):
        match = RUN.match(name)
        if not match:
            continue
        metrics = os.path.join(sweep_dir, name, "metrics.jsonl")
        record = last_eval(metrics) if os.path.exists(metrics) else None
        if record is None or record.get("accuracy") is None:
            unfinished.append(name)
            continue
        key = (match["model"], int(match["t"]), int(match["d"]))
        candidate = (float(record["accuracy"]), match["lr"], int(record["step"]))
        if key not in best or candidate[0] > best[key][0]:
            best[key] = candidate
    return best, unfinished


def write_table(best, path):
    models = sorted({k[0] for k in best}, key=lambda m: list(NAMES).index(m) if m in NAMES else 99)
    seqs = sorted({k[1] for k in best})
    dims = sorted({k[2] for k in best})
    lines = ["| sequence length | model | " + " | ".join(f"D = {d}" for d in dims) + " |",
             "|---|---|" + "---|" * len(dims)]
    for t in seqs:
        for m in models:
            cells = []
            for d in dims:
                entry = best.get((m, t, d))
                cells.append(f"{entry[0]:.3f} (lr {entry[1]})" if entry else "-")
            lines.append(f"| {t} | {NAMES.get(m, m)} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def draw(best, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seqs = sorted({k[1] for k in best})
    models = sorted({k[0] for k in best}, key=lambda m: list(NAMES).index(m) if m in NAMES else 99)
    fig, axes = plt.subplots(1, len(seqs), figsize=(3.2 * len(seqs), 3.0), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], seqs):
        for m in models:
            points = sorted((d, best[(m, tt, d)][0]) for (mm, tt, d) in best if mm == m and tt == t)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=NAMES.get(m, m))
        ax.set_xscale("log", base=2)
        dims = sorted({k[2] for k in best})
        ax.set_xticks(dims)
        ax.set_xticklabels([str(d) for d in dims])
        ax.set_title(f"sequence length {t}")
        ax.set_xlabel("model dimension")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy")
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir")
    parser.add_argument("-o", "--output", default=None, help="figure (PNG); default SWEEP_DIR/mqar.png")
    parser.add_argument("--table", default=None, help="markdown table; default SWEEP_DIR/mqar.md")
    args = parser.parse_args()
    best, unfinished = collect(args.sweep_dir)
    for name in unfinished:
        print(f"mqar_figure: {name} has no held-out evaluation (unfinished or failed)", file=sys.stderr)
    if not best:
        sys.exit(f"mqar_figure: no finished runs in {args.sweep_dir}")
    table = args.table or os.path.join(args.sweep_dir, "mqar.md")
    write_table(best, table)
    figure = args.output or os.path.join(args.sweep_dir, "mqar.png")
    draw(best, figure)
    print(f"mqar_figure: {len(best)} cells; table {table}, figure {figure}")


if __name__ == "__main__":
    main()
