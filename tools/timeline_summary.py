#!/usr/bin/env python3
"""timeline_summary.py: where a training step's GPU time goes, from a kernel_timeline.csv (tools/kernel_timeline.cpp).

Steps are delimited by the optimiser (the end of each step's last adamw_kernel); the last --steps complete steps are
summarised: span, time the GPU ran kernels/memsets/memcpys, and idle time split into
  host-bound: the next operation's launch call returned only after the GPU had gone idle (the host was late: after a
              sync, or busy with its own work),
  launch latency: the launch was already queued, the gap is the GPU's own turnaround between two operations,
plus the largest gaps with their neighbours, the host calls that waited for the GPU, the step's time by part of the
model (GEMMs, recurrence, norms, ...: PARTS below) and the kernels by total time.
Kernels may overlap (the recurrence's programmatic dependent launches: a dependent starts while the kernel before it
finishes, and its duration includes its wait for that kernel). The parts therefore count busy time: a stretch where
several operations ran counts once, for the one that started first, so the parts and the idle time add up to the
span. The kernel table gives each kernel's whole duration and, where it differs, that busy ("own") time.
With --compare BASE.csv: the same summary for both timelines side by side (base, this, difference) by part and for
the kernels whose time moved most: a same-machine A/B of GPU time per step, which moves far less from step to step
than the steps' wall times do.
Data parallelism: NCCL's kernels run on a stream of their own beside the model's. The summary then also gives the
time the model's kernels ran (any of them), the time NCCL's did, the time NCCL's ran alone, and each part's summed
kernel durations: comparing one rank of N GPUs (one CSV a rank, HGRN_TIMELINE_OUT set per rank) with a 1-GPU run
shows how much longer the model's kernels take beside the communication.

  python3 tools/timeline_summary.py timeline.csv [--steps 2] [--top 25] [--compare base-timeline.csv]
"""
import argparse
import collections
import re
import sys


def short_name(name):
    """A kernel's function name without return type, namespaces' noise or argument lists (templates kept short)."""
    name = name.replace("hgrn::", "").replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*\)$", "", name)  # argument list
    name = re.sub(r"^void ", "", name)
    return name[:110]


# The parts of a step, by kernel name (first match wins; anything else is "other": memsets, copies, embedding).
PARTS = [
    ("communication (NCCL)", ("nccl",)),
    ("GEMMs", ("nvjet", "splitKreduce", "gemm", "cutlass", "xmma")),
    ("recurrence", ("bwd_dqk", "fwd_output", "state_pass", "bwd_dv", "hgru2", "summary_kernel", "carry_kernel",
                    "output_kernel", "grads_kernel")),
    ("RMSNorm", ("rmsnorm",)),
    ("SwiGLU", ("swiglu",)),
    ("gates", ("gates", "input_gate", "lower_bound")),
    ("weight-gradient chunk sums", ("add_chunk_sums",)),
    ("optimizer", ("adamw", "sum_of_squares", "sum_partials", "scale_kernel")),
    ("loss", ("cross_entropy",)),
    ("casts", ("cast_kernel",)),
]


def part_of(name):
    for part, patterns in PARTS:
        if any(p in name for p in patterns):
            return part
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=2, help="complete steps to summarise (the last ones)")
    ap.add_argument("--top", type=int, default=25, help="rows in the largest-gaps and kernel tables")
    ap.add_argument("--compare", metavar="BASE_CSV", help="another run's timeline: print both, base first, and the "
                    "differences (this - base) by part and kernel")
    args = ap.parse_args()
    if args.compare:
        compare(summarise(args.compare, args.steps), summarise(args.csv, args.steps), args.top)
        return
    report(summarise(args.csv, args.steps), args.top)


def covered(intervals):
    """Total length of the union of (start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def summarise(path, steps):
    """The last `steps` complete steps of a timeline: per-step figures in ns and the per-kernel table."""
    device, api = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(",", 4)
            if len(parts) != 5:
                sys.exit(f"{path}:{n}: expected kind,start,end,correlation,name; got {line.strip()!r}")
            kind, start, end, corr, name = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4]
            if kind == "api":
                api[corr] = (start, end, name)
            else:
                device.append((start, end, kind, name, corr))
    device.sort()
    if not device:
        sys.exit(f"{path}: no GPU records (was CUDA_INJECTION64_PATH set to libhgrn_kernel_timeline.so?)")

    # Step ends: the last adamw_kernel before the next step's first non-optimiser work.
    ends = []
    for i, (s, e, kind, name, _) in enumerate(device):
        if "adamw_kernel" in name and (i + 1 == len(device) or "adamw_kernel" not in device[i + 1][3]):
            ends.append(e)
    if len(ends) < steps + 1:
        sys.exit(f"{path}: found {len(ends)} optimiser steps; need {steps + 1} (run more steps)")
    t0, t1 = ends[-steps - 1], ends[-1]
    recs = [r for r in device if r[0] >= t0 and r[1] <= t1]

    busy = 0
    by_kind = collections.Counter()
    by_name = collections.defaultdict(lambda: [0, 0, 0])  # duration, calls, own (busy) time
    gaps = []
    host_bound = latency = 0
    cursor, prev = t0, None
    for s, e, kind, name, corr in recs:
        if s > cursor:
            gap = s - cursor
            launch = api.get(corr)
            late = launch is not None and launch[1] > cursor  # the call that queued it ended after the GPU went idle
            if late:
                host_bound += gap
            else:
                latency += gap
            gaps.append((gap, late, prev[3] if prev else "step start", name, launch[2] if launch else "?"))
        own = max(0, e - max(s, cursor))  # the part of it that no operation started earlier covers
        busy += own
        cursor = max(cursor, e)
        by_kind[kind] += e - s
        entry = by_name[(kind, short_name(name))]
        entry[0] += e - s
        entry[1] += 1
        entry[2] += own
        prev = (s, e, kind, name)

    waits = collections.defaultdict(lambda: [0, 0])
    for start, end, name in api.values():
        if start >= t0 and end <= t1 and ("Synchronize" in name or "Memcpy" in name and "Async" not in name):
            waits[name][0] += end - start
            waits[name][1] += 1
    by_part, by_part_summed = collections.Counter(), collections.Counter()
    for (kind, name), (total, _, own) in by_name.items():
        part = part_of(name) if kind == "kernel" else "other"
        by_part[part] += own
        by_part_summed[part] += total
    is_comm = lambda name: "nccl" in name
    model = covered([(s, e) for s, e, _, name, _ in recs if not is_comm(name)])
    comm = covered([(s, e) for s, e, _, name, _ in recs if is_comm(name)])
    return {"steps": steps, "records": len(recs), "span": t1 - t0, "busy": busy, "by_kind": by_kind,
            "host_bound": host_bound, "latency": latency, "latency_gaps": sum(1 for g in gaps if not g[1]),
            "gaps": gaps, "waits": waits, "by_name": by_name, "by_part": by_part, "by_part_summed": by_part_summed,
            "model_busy": model, "comm_busy": comm, "comm_alone": busy - model}


def report(r, top):
    steps = r["steps"]
    ms = lambda ns: ns / 1e6 / steps
    span, busy = r["span"], r["busy"]
    print(f"{r['records']} GPU operations in {steps} step(s); per step:")
    print(f"  span {ms(span):.2f} ms; GPU busy {ms(busy):.2f} ms ({100 * busy / span:.1f}%)")
    for kind, total in r["by_kind"].most_common():
        print(f"    {kind:7s} {ms(total):8.2f} ms")
    print(f"  idle {ms(span - busy):.2f} ms: host-bound {ms(r['host_bound']):.2f} ms, launch latency "
          f"{ms(r['latency']):.2f} ms ({r['latency_gaps'] / steps:.0f} gaps, mean "
          f"{r['latency'] / max(1, r['latency_gaps']) / 1e3:.2f} us)")

    if r["comm_busy"]:
        print(f"  model kernels ran {ms(r['model_busy']):.2f} ms; NCCL's {ms(r['comm_busy']):.2f} ms, "
              f"{ms(r['comm_alone']):.2f} ms of it with no model kernel running")

    print(f"\nlargest gaps (per occurrence, us; H = host-bound):")
    for gap, late, before, after, call in sorted(r["gaps"], reverse=True)[:top]:
        print(f"  {gap / 1e3:9.1f} {'H' if late else ' '}  {short_name(before)[:60]:60s} -> {short_name(after)[:60]} "
              f"[{call}]")

    if r["waits"]:
        print("\nhost calls that wait for the GPU (per step):")
        for name, (total, count) in sorted(r["waits"].items(), key=lambda kv: -kv[1][0]):
            print(f"  {name:40s} {count / steps:6.1f} calls {ms(total):8.2f} ms")

    print(f"\nby part (per step, busy time: overlaps counted once; share of the span):")
    for part, total in r["by_part"].most_common():
        print(f"  {ms(total):8.3f} ms {100 * total / span:5.1f}%  {part}")
    print(f"  {ms(span - busy):8.3f} ms {100 * (span - busy) / span:5.1f}%  GPU idle")
    print(f"\nby part (per step, the kernels' durations summed: overlapped stretches count for each):")
    for part, total in r["by_part_summed"].most_common():
        print(f"  {ms(total):8.3f} ms  {part}")

    print(f"\nGPU operations by total time (per step):")
    for (kind, name), (total, count, own) in sorted(r["by_name"].items(), key=lambda kv: -kv[1][0])[:top]:
        overlapped = f" (own {ms(own):.3f} ms)" if total - own > 0.001 * total else ""
        print(f"  {ms(total):8.3f} ms {count / steps:6.1f} x {total / count / 1e3:8.1f} us  {name}{overlapped}")


def compare(base, this, top):
    """Per-step figures of two timelines: base, this and this - base (ms)."""
    ms = lambda r, ns: ns / 1e6 / r["steps"]
    row = lambda label, b, t: print(f"  {b:9.3f} {t:9.3f} {t - b:+9.3f}  {label}")
    print(f"per step, ms:      base      this    change")
    row("span", ms(base, base["span"]), ms(this, this["span"]))
    row("GPU busy", ms(base, base["busy"]), ms(this, this["busy"]))
    row("idle: host-bound", ms(base, base["host_bound"]), ms(this, this["host_bound"]))
    row("idle: launch latency", ms(base, base["latency"]), ms(this, this["latency"]))
    row("model kernels running (any)", ms(base, base["model_busy"]), ms(this, this["model_busy"]))
    row("NCCL kernels running", ms(base, base["comm_busy"]), ms(this, this["comm_busy"]))
    row("NCCL kernels alone", ms(base, base["comm_alone"]), ms(this, this["comm_alone"]))
    row("GPU operations (count, not ms)", base["records"] / base["steps"], this["records"] / this["steps"])
    for key, title in (("by_part", "by part (busy time: an overlapped stretch counts once, for the first to start):"),
                       ("by_part_summed", "by part (the kernels' durations summed):")):
        print(f"\n{title}")
        parts = sorted(set(base[key]) | set(this[key]), key=lambda p: -this[key].get(p, 0))
        for part in parts:
            row(part, ms(base, base[key].get(part, 0)), ms(this, this[key].get(part, 0)))
    print(f"\nkernels whose time per step moved most (calls per step base -> this):")
    names = set(base["by_name"]) | set(this["by_name"])
    total = lambda r, key: ms(r, r["by_name"][key][0]) if key in r["by_name"] else 0.0
    calls = lambda r, key: r["by_name"][key][1] / r["steps"] if key in r["by_name"] else 0.0
    for key in sorted(names, key=lambda k: -abs(total(this, k) - total(base, k)))[:top]:
        row(f"{key[1]} ({calls(base, key):g} -> {calls(this, key):g})", total(base, key), total(this, key))


if __name__ == "__main__":
    main()
