#!/usr/bin/env python3
"""plot_runs.py: draws one or more hgrn training runs from their metrics.jsonl files.

Usage:
    python3 tools/plot_runs.py RUN_DIR [RUN_DIR ...] [-o FILE.png] [--x steps|tokens]

Each RUN_DIR is a run directory (logging.run_dir: it holds metrics.jsonl) or a metrics file itself. The figure has
five panels: training loss, held-out loss, learning rate, gradient norm (before clipping) and throughput (tokens/s),
against optimiser steps or tokens seen; several runs are overlaid, each labelled with its directory name. The PNG
goes to FILE.png (default runs.png); the path is printed.

metrics.jsonl holds one JSON object a line: {"kind": "train", "step", "loss", "accuracy", "grad_norm", "lr",
"tokens_per_s", "tokens_seen", "elapsed_s", ...} every logging.log_interval steps and {"kind": "eval", "step",
"loss", "accuracy"} at each evaluation. A value that is absent, null, NaN, infinite or negative where it cannot be (-1 marks
values that do not exist, such as MFU on a CPU) is skipped. When a resumed run logs a step again (it restarted from
a checkpoint older than its last log lines), the later records replace the earlier ones from that step on.

Needs matplotlib (`pip install matplotlib`); it draws with the Agg backend, so no display is needed.
Exit status: 0 the plot was written; 1 a file is missing or malformed (the message names the file and line);
2 a bad command line.
"""

import argparse
import json
import math
import os
import re
import sys

METRICS_FILE = "metrics.jsonl"

# (panel title, record kind, field, y-axis label, log scale)
PANELS = [
    ("training loss", "train", "loss", "loss (nats/token)", False),
    ("held-out loss", "eval", "loss", "loss (nats/token)", False),
    ("learning rate", "train", "lr", "learning rate", False),
    ("gradient norm (before clipping)", "train", "grad_norm", "global norm", True),
    ("throughput", "train", "tokens_per_s", "tokens/s", False),
]


class MetricsError(Exception):
    pass


def metrics_path(run):
    """The metrics file of a run directory, or the file itself."""
    if os.path.isdir(run):
        path = os.path.join(run, METRICS_FILE)
        if not os.path.isfile(path):
            raise MetricsError(f"{run}: no {METRICS_FILE} in this directory (is it a run directory, logging.run_dir?)")
        return path
    if os.path.isfile(run):
        return run
    raise MetricsError(f"{run}: no such run directory or metrics file")


def run_label(run):
    path = os.path.normpath(run)
    if os.path.isfile(path):
        parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
        return parent or os.path.basename(path)
    return os.path.basename(os.path.abspath(path))


# printf writes non-finite doubles as nan / inf, which JSON does not have; read them as NaN / Infinity.
_NON_FINITE = re.compile(r'(?<=[:\[,\s])(-?)(nan|inf|infinity)(?=\s*[,}\]])', re.IGNORECASE)


def parse_line(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        patched = _NON_FINITE.sub(lambda m: m.group(1) + ("NaN" if m.group(2).lower() == "nan" else "Infinity"), text)
        if patched == text:
            raise
        return json.loads(patched)


def value(record, field):
    """A field's value as a float, or None where it is absent, null, non-numeric, not finite or negative
    (-1 marks a value the run does not have)."""
    v = record.get(field)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    if not math.isfinite(v) or v < 0:
        return None
    return v


def read_metrics(path):
    """The train and eval records of one file, in step order, later records replacing earlier ones from a step on."""
    records = {"train": [], "eval": []}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                record = parse_line(text)
            except json.JSONDecodeError as e:
                raise MetricsError(f"{path}:{number}: not a JSON object ({e.msg} at column {e.colno}): {text[:120]}")
            if not isinstance(record, dict):
                raise MetricsError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}: {text[:120]}")
            kind = record.get("kind", "train")
            if kind not in records:
                continue  # a kind this tool does not draw
            step = record.get("step")
            if isinstance(step, bool) or not isinstance(step, (int, float)) or step < 0:
                raise MetricsError(f"{path}:{number}: expected a non-negative \"step\" number, got {step!r}")
            series = records[kind]
            # A resumed run logs again from its checkpoint's step: those records replace the earlier ones.
            while series and series[-1]["step"] >= step:
                series.pop()
            series.append(record)
    return records


def tokens_at(train, step):
    """Tokens seen at `step`, from the train records (interpolated between them, extrapolated at a constant rate)."""
    points = [(r["step"], value(r, "tokens_seen")) for r in train]
    points = [(s, t) for s, t in points if t is not None and s > 0]
    if not points:
        return None
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if s0 <= step <= s1:
            return t0 + (t1 - t0) * (step - s0) / (s1 - s0) if s1 > s0 else t0
    s, t = points[0] if step < points[0][0] else points[-1]
    return t * step / s


def series(records, kind, field, x_axis):
    xs, ys = [], []
    for record in records[kind]:
        y = value(record, field)
        if y is None:
            continue
        if x_axis == "steps":
            x = float(record["step"])
        else:
            x = value(record, "tokens_seen")
            if x is None:
                x = tokens_at(records["train"], record["step"])
            if x is None:
                continue
        xs.append(x)
        ys.append(y)
    return xs, ys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or metrics.jsonl files)")
    parser.add_argument("-o", "--output", default="runs.png", metavar="FILE.png", help="output image (default runs.png)")
    parser.add_argument("--x", dest="x_axis", choices=["steps", "tokens"], default="steps",
                        help="horizontal axis: optimiser steps (default) or tokens seen")
    parser.add_argument("--title", default=None, help="a title above the panels")
    args = parser.parse_args(argv)

    try:
        runs = [(run_label(run), read_metrics(metrics_path(run)), run) for run in args.runs]
    except (MetricsError, OSError, UnicodeDecodeError) as e:
        print(f"plot_runs.py: {e}", file=sys.stderr)
        return 1

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_runs.py: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1

    # The same label twice (runs/a/x and runs/b/x) would make the legend ambiguous: use the paths then.
    labels = [label for label, _, _ in runs]
    if len(set(labels)) < len(labels):
        runs = [(os.path.normpath(path), records, path) for _, records, path in runs]

    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    axes = axes.flatten()
    x_label = "step" if args.x_axis == "steps" else "tokens seen"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for panel, (title, kind, field, y_label, log_scale) in enumerate(PANELS):
        ax = axes[panel]
        drawn = False
        for index, (label, records, _) in enumerate(runs):
            xs, ys = series(records, kind, field, args.x_axis)
            if not xs:
                continue
            style = "o-" if kind == "eval" or len(xs) < 30 else "-"
            ax.plot(xs, ys, style, color=colors[index % len(colors)], label=label, linewidth=1.4, markersize=3.5)
            drawn = True
        ax.set_title(title)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(True, alpha=0.3)
        if drawn and log_scale and all(min(series(r, kind, field, args.x_axis)[1] or [1]) > 0 for _, r, _ in runs):
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, "no values in these runs", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
        if args.x_axis == "tokens":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    # The sixth cell holds the legend: one entry per run, readable however many panels have data.
    legend_ax = axes[len(PANELS)]
    legend_ax.axis("off")
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], linewidth=2.5) for i in range(len(runs))]
    legend_ax.legend(handles, [label for label, _, _ in runs], loc="center", title="runs", frameon=False,
                     fontsize="large", title_fontsize="large")
    if args.title:
        figure.suptitle(args.title)
    figure.tight_layout()
    try:
        figure.savefig(args.output, dpi=110)
    except OSError as e:
        print(f"plot_runs.py: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
