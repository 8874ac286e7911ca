#!/usr/bin/env python3
"""timeline_summary.py: where a training step's GPU time goes, from a kernel_timeline.csv (tools/kernel_timeline.cpp).

Steps are delimited by the optimiser (the end of each step's last adamw_kernel); the last --steps complete steps are
summarised: span, time the GPU ran kernels/memsets/memcpys, and idle time split into
  host-bound: the next operation's launch call returned only after the GPU had gone idle (the host was late: after a
              sync, or busy with its own work),
  launch latency: the launch was already queued, the gap is the GPU's own turnaround between two operations,
plus the largest gaps with their neighbours, the host calls that waited for the GPU, and the kernels by total time.

  python3 tools/timeline_summary.py timeline.csv [--steps 2] [--top 25]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=2, help="complete steps to summarise (the last ones)")
    ap.add_argument("--top", type=int, default=25, help="rows in the largest-gaps and kernel tables")
    args = ap.parse_args()

    device, api = [], {}
    with open(args.csv) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(",", 4)
            if len(parts) != 5:
                sys.exit(f"{args.csv}:{n}: expected kind,start,end,correlation,name; got {line.strip()!r}")
            kind, start, end, corr, name = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4]
            if kind == "api":
                api[corr] = (start, end, name)
            else:
                device.append((start, end, kind, name, corr))
    device.sort()
    if not device:
        sys.exit(f"{args.csv}: no GPU records (was CUDA_INJECTION64_PATH set to libhgrn_kernel_timeline.so?)")

    # Step ends: the last adamw_kernel before the next step's first non-optimiser work.
    ends = []
    for i, (s, e, kind, name, _) in enumerate(device):
        if "adamw_kernel" in name and (i + 1 == len(device) or "adamw_kernel" not in device[i + 1][3]):
            ends.append(e)
    if len(ends) < args.steps + 1:
        sys.exit(f"{args.csv}: found {len(ends)} optimiser steps; need {args.steps + 1} (run more steps)")
    t0, t1 = ends[-args.steps - 1], ends[-1]
    recs = [r for r in device if r[0] >= t0 and r[1] <= t1]
    span = (t1 - t0) / args.steps

    busy = 0
    by_kind = collections.Counter()
    by_name = collections.defaultdict(lambda: [0, 0])
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
        busy += max(0, e - max(s, cursor))
        cursor = max(cursor, e)
        by_kind[kind] += e - s
        by_name[(kind, short_name(name))][0] += e - s
        by_name[(kind, short_name(name))][1] += 1
        prev = (s, e, kind, name)

    ms = lambda ns: ns / 1e6 / args.steps
    print(f"{len(recs)} GPU operations in {args.steps} step(s); per step:")
    print(f"  span {ms(t1 - t0):.2f} ms; GPU busy {ms(busy):.2f} ms ({100 * busy / (t1 - t0):.1f}%)")
    for kind, total in by_kind.most_common():
        print(f"    {kind:7s} {ms(total):8.2f} ms")
    print(f"  idle {ms(t1 - t0 - busy):.2f} ms: host-bound {ms(host_bound):.2f} ms, launch latency {ms(latency):.2f} ms "
          f"({sum(1 for g in gaps if not g[1]) / args.steps:.0f} gaps, mean "
          f"{latency / max(1, sum(1 for g in gaps if not g[1])) / 1e3:.2f} us)")

    print(f"\nlargest gaps (per occurrence, us; H = host-bound):")
    for gap, late, before, after, call in sorted(gaps, reverse=True)[: args.top]:
        print(f"  {gap / 1e3:9.1f} {'H' if late else ' '}  {short_name(before)[:60]:60s} -> {short_name(after)[:60]} "
              f"[{call}]")

    waits = collections.defaultdict(lambda: [0, 0])
    for start, end, name in api.values():
        if start >= t0 and end <= t1 and ("Synchronize" in name or "Memcpy" in name and "Async" not in name):
            waits[name][0] += end - start
            waits[name][1] += 1
    if waits:
        print("\nhost calls that wait for the GPU (per step):")
        for name, (total, count) in sorted(waits.items(), key=lambda kv: -kv[1][0]):
            print(f"  {name:40s} {count / args.steps:6.1f} calls {ms(total):8.2f} ms")

    print(f"\nGPU operations by total time (per step):")
    for (kind, name), (total, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {ms(total):8.3f} ms {count / args.steps:6.1f} x {total / count / 1e3:8.1f} us  {name}")


if __name__ == "__main__":
    main()
