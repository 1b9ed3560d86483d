#!/usr/bin/env python3
"""Plot the chain fidelity benchmark (paper 003 fig. 4/5): one TCP flow's
goodput through chain:N as a ratio to the configured rate, TDF 1 vs 4, at
4 and 10 Gb/s; and the wall-clock time of each run.

usage: fidelity_plot.py RESULTS.csv OUT.png
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit("fidelity_plot.py: no rows in " + sys.argv[1])
    series = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (int(r["configured_mbit"]), int(r["tdf"]))
        series[key][int(r["switches"])].append((float(r["ratio_to_configured"]), float(r["wall_s"])))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for (bw, tdf), pts in sorted(series.items()):
        xs = sorted(pts)
        ratio = [sum(p[0] for p in pts[x]) / len(pts[x]) for x in xs]
        wall = [sum(p[1] for p in pts[x]) / len(pts[x]) for x in xs]
        style = dict(marker="o" if tdf > 1 else "s", linestyle="-" if tdf > 1 else "--",
                     color="tab:red" if bw >= 10000 else "tab:blue")
        label = f"{bw / 1000:g} Gb/s, TDF {tdf}"
        a1.plot(xs, ratio, label=label, **style)
        a2.plot(xs, wall, label=label, **style)
    a1.axhline(1448 / 1514, color="grey", linewidth=0.8, linestyle=":")
    a1.set_xlabel("switches in the chain")
    a1.set_ylabel("goodput / configured rate")
    a1.set_ylim(0, 1.05)
    a1.set_title("one TCP flow through chain:N")
    a2.set_xlabel("switches in the chain")
    a2.set_ylabel("wall-clock time of the run (s)")
    a2.set_title("the price: real time")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("Fidelity with and without time dilation (paper 003 fig. 4/5)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
