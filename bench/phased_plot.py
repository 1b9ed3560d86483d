#!/usr/bin/env python3
"""Plot the phased-workload benchmark (paper 003 fig. 6, table 1): each
flow's goodput per phase as a ratio to the configured rate for the three
cases (TDF 1, fixed TDF, adaptive), the wall-clock time of each case against
the virtual duration, and the adaptive case's TDF trace.

usage: phased_plot.py PHASED.csv PHASED_TDF.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    trace = list(csv.DictReader(open(sys.argv[2])))
    if not rows:
        sys.exit("phased_plot.py: no rows in " + sys.argv[1])
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / len(cases)
    labels = ["flow 1, phase 1", "flows 1-5, phase 2 (mean)", "flow 1, phase 3"]
    for i, c in enumerate(cases):
        cr = [r for r in rows if r["case"] == c]
        ph1 = [float(r["ratio_to_configured"]) for r in cr if r["phase"] == "1"]
        ph2 = [float(r["ratio_to_configured"]) for r in cr if r["phase"] == "2"]
        ph3 = [float(r["ratio_to_configured"]) for r in cr if r["phase"] == "3"]
        vals = [sum(v) / len(v) if v else 0 for v in (ph1, ph2, ph3)]
        xs = [k + i * width for k in range(3)]
        a1.bar(xs, vals, width, label=f"{c} (mean TDF {cr[0]['tdf_mean']})")
        # Each flow of phase 2 as a dot.
        a1.plot([1 + i * width] * len(ph2), ph2, "k.", markersize=4)
        a2.bar(i, float(cr[0]["wall_s"]) / float(cr[0]["virtual_s"]), label=c)
    a1.set_xticks([k + width * (len(cases) - 1) / 2 for k in range(3)])
    a1.set_xticklabels(labels, fontsize=8)
    a1.set_ylabel("goodput / configured rate")
    a1.set_ylim(0, 1.05)
    a1.legend(fontsize=7, loc="lower left")
    a2.set_xticks(range(len(cases)))
    a2.set_xticklabels(cases)
    a2.set_ylabel("wall-clock time / virtual time")
    a2.set_title("the price of fidelity")
    for c in cases:
        pts = [(float(t["seconds"]), float(t["tdf"])) for t in trace if t["case"] == c]
        if pts:
            a3.step(*zip(*pts), where="post", label=c)
    a3.set_xlabel("seconds (real)")
    a3.set_ylabel("TDF")
    a3.set_title("adaptive TDF trace")
    for a in (a1, a2, a3):
        a.grid(True, alpha=0.3)
    fig.suptitle("Phased workload on linear:100 (paper 003 fig. 6 / table 1)")
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=110)
    print("wrote", sys.argv[3])


if __name__ == "__main__":
    main()
