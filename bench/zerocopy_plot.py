"""Summarizes bench/zerocopy.sh's runs: median CPU per KiB per mode and size,
ratios to copied sends in the same run, the crossover size; CSV and PNG."""
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(out_dir):
    out_dir = Path(out_dir)
    runs = list(csv.DictReader(open(out_dir / "zerocopy_runs.csv")))
    by = defaultdict(list)
    for r in runs:
        by[(r["mode"], int(r["size"]))].append(r)
    sizes = sorted({s for _, s in by})
    modes = [m for m in ("copy", "zerocopy", "uring") if any(k[0] == m for k in by)]

    def med(mode, size, key):
        return statistics.median(float(r[key]) for r in by[(mode, size)])

    rows = []
    for size in sizes:
        base = med("copy", size, "thread_ns_per_kib")
        base_sys = med("copy", size, "system_ns_per_kib")
        for mode in modes:
            rows.append(
                {
                    "mode": mode,
                    "size": size,
                    "thread_ns_per_kib": med(mode, size, "thread_ns_per_kib"),
                    "system_ns_per_kib": med(mode, size, "system_ns_per_kib"),
                    "gbit_per_s": med(mode, size, "gbit_per_s"),
                    "thread_x_copy": med(mode, size, "thread_ns_per_kib") / base,
                    "system_x_copy": med(mode, size, "system_ns_per_kib") / base_sys,
                    "completed_copied": sum(int(r["completed_copied"]) for r in by[(mode, size)]),
                }
            )
    with open(out_dir / "zerocopy.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    print("send-side CPU per KiB, median; ratio to copied sends of the same size and run:")
    for r in rows:
        print(
            f"  {r['mode']:<9} {r['size']:>6} B  {r['thread_ns_per_kib']:7.1f} ns/KiB ({r['thread_x_copy']:.2f}x copy)"
            f"  system {r['system_ns_per_kib']:7.1f} ({r['system_x_copy']:.2f}x)  {r['gbit_per_s']:6.1f} Gb/s"
            f"  copied completions {r['completed_copied']}"
        )
    for mode in modes:
        if mode == "copy":
            continue
        wins = [r["size"] for r in rows if r["mode"] == mode and r["thread_x_copy"] < 1.0]
        where = f"from {min(wins)} B" if wins else f"at no size up to {sizes[-1]} B"
        print(f"  crossover: {mode} costs less CPU per byte than copying {where}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in modes:
        xs = [r["size"] for r in rows if r["mode"] == mode]
        a.plot(xs, [r["thread_ns_per_kib"] for r in rows if r["mode"] == mode], marker="o", label=mode)
        b.plot(xs, [r["thread_x_copy"] for r in rows if r["mode"] == mode], marker="o", label=mode)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per send (UDP, GSO 1400)")
        ax.legend()
    a.set_ylabel("sending thread CPU, ns per KiB")
    a.set_title("send-side CPU per byte (sink drops on egress)")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_ylabel("CPU per byte / copied sends'")
    b.set_title("zero copy relative to copying")
    fig.tight_layout()
    fig.savefig(out_dir / "zerocopy.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1])
