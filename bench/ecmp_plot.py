#!/usr/bin/env python3
"""Plots bench/results/ecmp.csv (paper 003 fig. 10/11): per case, the average
throughput of the 8 flows (bars) and every flow (dots) as a ratio of the
configured link rate, stride 1 beside stride 4."""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    flows = defaultdict(list)
    order = []
    with open(src) as f:
        for row in csv.DictReader(f):
            key = (row["case"], int(row["stride"]))
            if row["case"] not in order:
                order.append(row["case"])
            flows[key].append(float(row["ratio_to_configured"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for s_i, stride in enumerate((1, 4)):
        xs, avgs = [], []
        for c_i, case in enumerate(order):
            vals = flows.get((case, stride), [])
            if not vals:
                continue
            x = c_i + (s_i - 0.5) * width
            xs.append(x)
            avgs.append(sum(vals) / len(vals))
            ax.scatter([x] * len(vals), vals, s=10, color="black", zorder=3)
        ax.bar(xs, avgs, width, label=f"stride {stride} (average)")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order)
    ax.set_ylabel("throughput / configured link rate")
    ax.set_title("fat tree k=4, 8 TCP flows, ECMP (dots: each flow)")
    ax.set_ylim(0, 1.15)
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main()
