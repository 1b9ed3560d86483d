#!/usr/bin/env python3
"""Compares two reflector builds from the runs bench/fanout_ab.sh made:
A-*.csv and B-*.csv in one directory, each a fanout-bench CSV with its own
raw-loop anchor.

The judged figure, fixed before the runs: per cell (size, receivers,
implementation), ns per copy as a ratio to the raw loop of the same run. A
ratio within a run is what the project quotes, and it does not move with
the host's slow stretches that shift a whole run (bench/fanout_repro.py's
doc: one run 20 % slower for every implementation alike). Per build, the
median of the cell's ratios over that build's runs; then B's median over
A's. A cell passes when B / A is within the tolerance (default ±10 %, the
spread the hardening issue's method is asked to resolve); the spread of A's
own runs is printed beside it. Cells where the sender could not saturate the
measured CPU in any run (sender's CPU >= 95 % busy) are printed but not
judged, as in fanout_repro.py.

Exits 1 if a judged cell is outside, 2 on bad input.

usage: fanout_ab.py [--tolerance PCT] DIR
"""
import csv
import glob
import os
import statistics
import sys

SENDER_BOUND = 95.0
ANCHOR = "raw-loop"


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or "ns_per_copy" not in rows[0]:
        sys.exit(f"fanout_ab.py: {path}: no rows with ns_per_copy")
    return {
        (int(r["size"]), int(r["receivers"]), r["impl"]): (float(r["ns_per_copy"]), float(r.get("sender_busy_pct") or 0))
        for r in rows
    }


def ratios(runs, key):
    anchor = (key[0], key[1], ANCHOR)
    return [r[key][0] / r[anchor][0] for r in runs]


def main(argv):
    tol = 10.0
    if len(argv) >= 2 and argv[0] == "--tolerance":
        tol, argv = float(argv[1]), argv[2:]
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    d = argv[0]
    sides = {s: [load(p) for p in sorted(glob.glob(os.path.join(d, f"{s}-*.csv")))] for s in "AB"}
    if any(len(v) < 2 for v in sides.values()):
        print(f"fanout_ab.py: {d} needs at least two runs of each build (A-*.csv, B-*.csv)", file=sys.stderr)
        return 2
    every = sides["A"] + sides["B"]
    keys = sorted(set(every[0]).intersection(*every[1:]))
    keys = [k for k in keys if k[2] != ANCHOR and (k[0], k[1], ANCHOR) in keys]
    if not keys:
        print("fanout_ab.py: no cell with an anchor in every run", file=sys.stderr)
        return 2
    print(f"ns per copy / the same run's raw loop; median over runs [lowest-highest]; "
          f"A {len(sides['A'])} runs, B {len(sides['B'])} runs; tolerance ±{tol:g} %")
    print(f"{'size':>5} {'recv':>4} {'impl':10} {'A':>22} {'A spread %':>10} {'B':>22} {'B/A':>6}")
    bad, judged = [], 0
    for k in keys:
        a, b = ratios(sides["A"], k), ratios(sides["B"], k)
        ma, mb = statistics.median(a), statistics.median(b)
        spread = max(abs(v - ma) * 100.0 / ma for v in a)
        bound = max(r[k][1] for r in every) >= SENDER_BOUND or max(r[(k[0], k[1], ANCHOR)][1] for r in every) >= SENDER_BOUND
        q = mb / ma
        if bound:
            flag = "  (sender-bound: not judged)"
        else:
            judged += 1
            flag = "" if abs(q - 1) * 100.0 <= tol else "  <-- outside"
            if flag:
                bad.append(k)
        print(
            f"{k[0]:5} {k[1]:4} {k[2]:10} {ma:7.3f} [{min(a):.3f}-{max(a):.3f}] {spread:10.1f} "
            f"{mb:7.3f} [{min(b):.3f}-{max(b):.3f}] {q:6.3f}{flag}"
        )
    anchors = [(k[0], k[1], ANCHOR) for k in sorted({(k[0], k[1]) for k in keys})]
    print("\nthe anchor itself, ns per copy (median over runs [lowest-highest]):")
    for k in anchors:
        a = [r[k][0] for r in sides["A"]]
        b = [r[k][0] for r in sides["B"]]
        print(f"{k[0]:5} {k[1]:4} A {statistics.median(a):8.1f} [{min(a):.1f}-{max(a):.1f}]  "
              f"B {statistics.median(b):8.1f} [{min(b):.1f}-{max(b):.1f}]")
    if not judged:
        print("fanout_ab.py: every cell is sender-bound: nothing to judge", file=sys.stderr)
        return 2
    if bad:
        print(f"\nB differs from A by more than ±{tol:g} % in {len(bad)} of {judged} judged cells")
        return 1
    print(f"\nB is within ±{tol:g} % of A in all {judged} judged cells")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
