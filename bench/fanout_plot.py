#!/usr/bin/env python3
"""Plot the in-kernel fan-out benchmark: the reflector's share of CPU per
copy (on the CPU the run is pinned to, softirq included), and delivered
copies per second, vs receivers.

One column per datagram size, one line per implementation (sendto, sendmmsg,
ebpf, native IP multicast). Rows: the reflector's share of CPU per copy
(over the clients-only anchor of the same run; log scale), the same
as a ratio to the sendto backend, and copies/s the receivers got.

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
}
ROWS = [
    ("share_ns_per_copy", "reflector's share of\nCPU per copy (ns)", True),
    ("share_vs_sendto", "share / sendto's", False),
    ("copies_per_s", "copies/s delivered", False),
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
    sizes = sorted({int(r["size"]) for r in rows})
    fig, axes = plt.subplots(len(ROWS), len(sizes), figsize=(4 * len(sizes), 3.2 * len(ROWS)), squeeze=False)
    for col, size in enumerate(sizes):
        for row, (key, label, log) in enumerate(ROWS):
            ax = axes[row][col]
            for imp, style in STYLE.items():
                pts = sorted(
                    (int(r["receivers"]), num(r[key]))
                    for r in rows
                    if int(r["size"]) == size and r["impl"] == imp
                )
                pts = [(x, y) for x, y in pts if y == y and (not log or y > 0)]
                if pts:
                    ax.plot(*zip(*pts), **style)
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
    fig.suptitle("In-kernel fan-out over veth: CPU per copy and throughput (paper 000 §5 grid)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
