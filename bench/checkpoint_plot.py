#!/usr/bin/env python3
"""Plot the checkpoint hand-off benchmark: time to serve an N MiB checkpoint
to K joiners at once, and the reflector's CPU for it, with the channel's
MSG_ZEROCOPY on (falling back to copies over veth) and off.

One column per checkpoint size; rows: time to the last byte (ms), the
reflector's CPU (ms, 10 ms ticks), and zerocopy/copy ratios of the time and
of machine-wide busy CPU (microsecond counters).

usage: checkpoint_plot.py RESULTS.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "copy": dict(color="tab:blue", marker="s", label="copies (--checkpoint-zerocopy off)"),
    "zerocopy": dict(color="tab:red", marker="o", label="MSG_ZEROCOPY, fell back to copies"),
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit("checkpoint_plot.py: no rows in " + sys.argv[1])
    sizes = sorted({int(r["size_mib"]) for r in rows})
    fig, axes = plt.subplots(3, len(sizes), figsize=(4 * len(sizes), 9), squeeze=False)
    for col, size in enumerate(sizes):
        cell = [r for r in rows if int(r["size_mib"]) == size]
        for row, key in enumerate(["wall_ms", "reflector_cpu_ms"]):
            ax = axes[row][col]
            for mode, style in STYLE.items():
                pts = sorted((int(r["joiners"]), float(r[key])) for r in cell if r["mode"] == mode)
                if pts:
                    ax.plot(*zip(*pts), **style)
            ax.set_ylabel({"wall_ms": "time to last byte (ms)", "reflector_cpu_ms": "reflector CPU (ms)"}[key])
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(f"{size} MiB checkpoint")
        ax = axes[2][col]
        for key, style in [("wall_ms", dict(color="tab:green", marker="s", label="time")),
                           ("machine_busy_ms", dict(color="tab:purple", marker="o", label="machine busy CPU"))]:
            pts = []
            for z in (r for r in cell if r["mode"] == "zerocopy"):
                c = next((r for r in cell if r["mode"] == "copy" and r["joiners"] == z["joiners"]), None)
                if c and float(c[key]) > 0:
                    pts.append((int(z["joiners"]), float(z[key]) / float(c[key])))
            if pts:
                ax.plot(*zip(*sorted(pts)), **style)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel("zerocopy / copy")
        ax.set_xlabel("joiners fetching at once")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    axes[2][0].legend(fontsize=7)
    fig.suptitle("Checkpoint hand-off over veth (the kernel copies on delivery: zero copy cannot gain here)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
