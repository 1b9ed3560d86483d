#!/usr/bin/env python3
"""vtime benchmark: summary CSV and plot from bench/results/vtime_clock.csv.

Median CPU ns per clock_gettime(CLOCK_MONOTONIC) per variant, the ratio to
no shim (the anchor, same run) and the ns added per call.

usage: vtime_plot.py RESULTS_DIR
"""
import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHOD = ("CPU time (getrusage user+sys) of a loop of clock_gettime(CLOCK_MONOTONIC) calls, one core (taskset),\n"
          "variants interleaved, median of the repetitions; anchor = no shim, same run")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    out = sys.argv[1]
    rows = list(csv.DictReader(open(os.path.join(out, "vtime_clock.csv"))))
    order = []
    per = {}
    for r in rows:
        v = r["variant"]
        if v not in per:
            order.append(v)
            per[v] = []
        per[v].append(float(r["ns_per_call"]))
    med = {v: statistics.median(per[v]) for v in order}
    base = med["none"]
    with open(os.path.join(out, "vtime_clock_summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "runs", "median_ns_per_call", "min_ns_per_call", "max_ns_per_call",
                    "ratio_vs_none", "added_ns_per_call"])
        for v in order:
            w.writerow([v, len(per[v]), f"{med[v]:.2f}", f"{min(per[v]):.2f}", f"{max(per[v]):.2f}",
                        f"{med[v] / base:.3f}", f"{med[v] - base:.2f}"])
    for v in order:
        print(f"vtime bench: {v:<20} {med[v]:7.2f} ns/call  x{med[v] / base:.2f}  (+{med[v] - base:.2f} ns)")

    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = {"none": "black", "libfaketime-x0.25": "tab:red"}
    bars = ax.bar(range(len(order)), [med[v] for v in order],
                  color=[colors.get(v, "tab:blue") for v in order])
    for i, v in enumerate(order):
        ax.plot([i] * len(per[v]), per[v], "k.", markersize=3)
        ax.annotate(f"{med[v]:.1f} ns\nx{med[v] / base:.2f}", (i, med[v]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.axhline(base + 10, color="gray", linestyle="--", linewidth=1)
    ax.text(len(order) - 0.5, base + 10, "goal: no shim + 10 ns", ha="right", va="bottom", fontsize=8,
            color="gray")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order)
    ax.set_ylabel("CPU ns per clock_gettime(CLOCK_MONOTONIC)")
    ax.set_ylim(0, max(max(p) for p in per.values()) * 1.25)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle("vtime shim overhead vs no shim vs libfaketime\n" + METHOD, fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "vtime_clock.png"), dpi=110)
    del bars


if __name__ == "__main__":
    main()
