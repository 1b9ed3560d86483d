#!/usr/bin/env python3
"""Plot the in-kernel fan-out benchmark: CPU per copy (ns of the measured
CPU per copy at saturation, softirq included, nothing subtracted) vs
receivers, with each cell's spread over its repetitions as error bars.

One column per datagram size, one line per implementation (sendto, sendmmsg,
ebpf, native IP multicast, and the raw sendto loop where it was measured). Rows: ns per copy (log scale; bars from the
lowest to the highest repetition), the same as a ratio to the sendto
backend's, and as a ratio to native multicast's (ratios of medians of one
run).

usage: fanout_plot.py RESULTS.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "sendto": dict(color="tab:blue", marker="s", label="reflector sendto (paper's user-space loop)"),
    "sendmmsg": dict(color="tab:orange", marker="^", label="reflector sendmmsg"),
    "ebpf": dict(color="tab:red", marker="o", label="reflector ebpf (in-kernel fan-out)"),
    "multicast": dict(color="black", marker="x", linestyle="--", label="native IP multicast (reference)"),
    "raw-loop": dict(color="tab:gray", marker="+", linestyle=":", label="raw sendto loop (reflector-bench's anchor)"),
    "raw-mmsg": dict(color="tab:green", marker="+", linestyle=":", label="raw sendmmsg loop, one call per datagram (floor)"),
    "raw-mmsg-batch": dict(color="tab:olive", marker="+", linestyle=":", label="raw sendmmsg loop, one call per batch (floor)"),
}
# (column, label, log scale, error-bar columns)
ROWS = [
    ("ns_per_copy", "CPU per copy (ns),\nrepetitions' min-max", True, ("ns_per_copy_min", "ns_per_copy_max")),
    ("vs_sendto", "per copy / sendto's", False, None),
    ("vs_multicast", "per copy / multicast's", False, None),
]


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit("fanout_plot.py: no rows in " + sys.argv[1])
    if "ns_per_copy" not in rows[0]:
        sys.exit("fanout_plot.py: " + sys.argv[1] + " has no ns_per_copy column (a CSV of the previous method?)")
    sizes = sorted({int(r["size"]) for r in rows})
    fig, axes = plt.subplots(len(ROWS), len(sizes), figsize=(4 * len(sizes), 3.2 * len(ROWS)), squeeze=False)
    for col, size in enumerate(sizes):
        for row, (key, label, log, bars) in enumerate(ROWS):
            ax = axes[row][col]
            for imp, style in STYLE.items():
                cells = sorted(
                    (int(r["receivers"]), r) for r in rows if int(r["size"]) == size and r["impl"] == imp
                )
                pts = [(x, num(r[key]), r) for x, r in cells]
                pts = [(x, y, r) for x, y, r in pts if y == y and (not log or y > 0)]
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ys = [p[1] for p in pts]
                if bars:
                    lo = [max(0.0, y - num(r[bars[0]])) for _, y, r in pts]
                    hi = [max(0.0, num(r[bars[1]]) - y) for _, y, r in pts]
                    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, **style)
                else:
                    ax.plot(xs, ys, **style)
            if log:
                ax.set_yscale("log")
            if row == 0:
                ax.set_title(f"{size} B datagrams")
            if col == 0:
                ax.set_ylabel(label)
            if row == len(ROWS) - 1:
                ax.set_xlabel("receivers")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        "In-kernel fan-out over veth (paper 000 §5 grid):\nCPU per copy at saturation of one measured CPU"
    )
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
