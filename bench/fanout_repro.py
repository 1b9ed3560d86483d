#!/usr/bin/env python3
"""Do several runs of the fan-out benchmark agree? Reads the CSVs of N runs
of fanout-bench (same grid) and prints, per cell (size, receivers,
implementation), each run's ns per copy, the median across runs and the
largest deviation from it (%); then the same for the ratios at each
(size, receivers): sendto/ebpf, ebpf/multicast, sendmmsg/sendto.
Exits 1 if any cell's ns per copy deviates from the median across runs by
more than the tolerance (default 10 %), 2 on bad input.

usage: fanout_repro.py [--tolerance PCT] RUN1.csv RUN2.csv [RUN3.csv ...]
"""
import csv
import statistics
import sys


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or "ns_per_copy" not in rows[0]:
        sys.exit(f"fanout_repro.py: {path}: no rows with ns_per_copy (a CSV of the saturation method?)")
    return {(int(r["size"]), int(r["receivers"]), r["impl"]): float(r["ns_per_copy"]) for r in rows}


def deviation(values):
    med = statistics.median(values)
    return med, max(abs(v - med) * 100.0 / med for v in values) if med > 0 else float("inf")


def main(argv):
    tol = 10.0
    if len(argv) >= 2 and argv[0] == "--tolerance":
        tol = float(argv[1])
        argv = argv[2:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = [load(p) for p in argv]
    keys = sorted(set(runs[0]).intersection(*runs[1:]))
    missing = set().union(*runs) - set(keys)
    if missing:
        print(f"fanout_repro.py: {len(missing)} cells are not in every run (compared only the common ones)", file=sys.stderr)
    if not keys:
        print("fanout_repro.py: the runs have no cell in common", file=sys.stderr)
        return 2
    print(f"ns per copy across {len(runs)} runs (deviation = largest |run - median| / median; tolerance ±{tol:g} %)")
    print(f"{'size':>5} {'recv':>4} {'impl':9} {'runs':>30} {'median':>8} {'dev %':>6}")
    bad = []
    for k in keys:
        vals = [r[k] for r in runs]
        med, dev = deviation(vals)
        flag = "" if dev <= tol else "  <-- outside"
        if dev > tol:
            bad.append(k)
        print(f"{k[0]:5} {k[1]:4} {k[2]:9} {' '.join(f'{v:.1f}' for v in vals):>30} {med:8.1f} {dev:6.1f}{flag}")
    print("\nratios of ns per copy within each run")
    pairs = [("sendto", "ebpf"), ("ebpf", "multicast"), ("sendmmsg", "sendto")]
    for size, rec in sorted({(k[0], k[1]) for k in keys}):
        for a, b in pairs:
            if (size, rec, a) in keys and (size, rec, b) in keys:
                vals = [r[(size, rec, a)] / r[(size, rec, b)] for r in runs]
                med, dev = deviation(vals)
                print(f"{size:5} {rec:4} {a + '/' + b:18} {' '.join(f'{v:.2f}x' for v in vals):>24} median {med:.2f}x dev {dev:.1f} %")
    worst = max(keys, key=lambda k: deviation([r[k] for r in runs])[1])
    print(f"\nworst cell: {worst[0]} B x {worst[1]} {worst[2]}: {deviation([r[worst] for r in runs])[1]:.1f} %")
    if bad:
        print(f"NOT REPRODUCIBLE: {len(bad)} of {len(keys)} cells differ by more than ±{tol:g} % from the median across runs")
        return 1
    print(f"reproducible: all {len(keys)} cells within ±{tol:g} % of the median across runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
