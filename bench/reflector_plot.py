#!/usr/bin/env python3
"""Plot the reflector benchmark: CPU per delivered copy vs receivers.

One column per datagram size, one line per implementation. Rows: CPU of the
process under test per copy (user+sys), the same as a ratio to the raw
sendto loop of the same cell (the anchor; the dashed line is the 1.25x
target), and machine-wide busy CPU per copy.

usage: reflector_plot.py RESULTS.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "raw-loop": dict(color="black", marker="o", label="raw sendto loop (anchor)"),
    "sendto": dict(color="tab:blue", marker="s", label="reflector sendto"),
    "sendmmsg": dict(color="tab:orange", marker="^", label="reflector sendmmsg (DATA tags on)"),
    "sendmmsg-untagged": dict(color="tab:green", marker="v", label="reflector sendmmsg, tags off"),
}
ROWS = [
    ("proc_cpu_ns_per_copy", "process CPU per copy (ns)"),
    ("ratio_proc_vs_raw", "process CPU / raw loop"),
    ("system_cpu_ns_per_copy", "machine-wide CPU per copy (ns)\nincl. other programs"),
]


def num(s):
    try:
        return float(s)
    except ValueError:
        return float("nan")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, out = sys.argv[1], sys.argv[2]
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{src}: no results to plot")
    sizes = sorted({int(r["payload_bytes"]) for r in rows})
    impls = [i for i in STYLE if any(r["impl"] == i for r in rows)]
    fig, axes = plt.subplots(
        len(ROWS), len(sizes), figsize=(3.6 * len(sizes), 3.0 * len(ROWS)), squeeze=False, sharex=True
    )
    for col, size in enumerate(sizes):
        for row, (field, ylabel) in enumerate(ROWS):
            ax = axes[row][col]
            for imp in impls:
                pts = sorted(
                    (int(r["receivers"]), num(r[field]))
                    for r in rows
                    if int(r["payload_bytes"]) == size and r["impl"] == imp
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], **STYLE[imp])
            if field.startswith("ratio"):
                ax.axhline(1.25, color="red", linestyle="--", linewidth=1, label="1.25x target")
                ax.axhline(1.0, color="grey", linewidth=0.5)
                lo, hi = ax.get_ylim()
                ax.set_ylim(min(lo, 0.8), max(hi, 1.35))
            else:
                ax.set_ylim(bottom=0)
            if row == 0:
                ax.set_title(f"{size}-byte datagrams")
            if row == len(ROWS) - 1:
                ax.set_xlabel("receivers")
            if col == 0:
                ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)
    fig.suptitle(
        "Reflector fan-out on loopback: CPU per delivered copy (median of runs)\n"
        "each backend vs a raw sendto loop measured in the same run"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
