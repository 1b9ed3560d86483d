"""bench/sealed.sh's summary and plot. Reads RESULTS/sealed_summary.csv
(the client half, from sealed-bench) and WORK/<backend>.csv (fanout-bench's
cells for IMPL:instance and IMPL:sealed) with WORK/unavailable.csv (the
backends that could not run, and why); writes RESULTS/sealed_reflector.csv
(per backend and size: clear and sealed ns per copy, the ratio sealed/clear
with its min/max over the interleaved repetition pairs, the spread of the
repetitions, whether the ratio is within it) and RESULTS/sealed.png."""
import csv
import glob
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

results, work = sys.argv[1], sys.argv[2]

client = list(csv.DictReader(open(os.path.join(results, "sealed_summary.csv"))))

rows = []
for path in sorted(glob.glob(os.path.join(work, "*.csv"))):
    if os.path.basename(path) == "unavailable.csv":
        continue
    backend = os.path.basename(path)[: -len(".csv")]
    cells = list(csv.DictReader(open(path)))
    for size in sorted({int(c["size"]) for c in cells}):
        by = {c["impl"].split(":")[1]: c for c in cells if int(c["size"]) == size}
        clear, sealed = by.get("instance"), by.get("sealed")
        if clear is None or sealed is None:
            continue
        cr = [float(x) for x in clear["ns_per_copy_runs"].split(";")]
        sr = [float(x) for x in sealed["ns_per_copy_runs"].split(";")]
        pairs = [s / c for s, c in zip(sr, cr)]
        ratio = float(sealed["ns_per_copy"]) / float(clear["ns_per_copy"])
        spread = max(float(clear["spread_pct"]), float(sealed["spread_pct"]))
        rows.append(
            {
                "backend": backend,
                "size": size,
                "receivers": clear["receivers"],
                "clear_ns_per_copy": clear["ns_per_copy"],
                "clear_spread_pct": clear["spread_pct"],
                "clear_runs": clear["ns_per_copy_runs"],
                "sealed_ns_per_copy": sealed["ns_per_copy"],
                "sealed_spread_pct": sealed["spread_pct"],
                "sealed_runs": sealed["ns_per_copy_runs"],
                "ratio": f"{ratio:.3f}",
                "ratio_pairs_min": f"{min(pairs):.3f}",
                "ratio_pairs_median": f"{statistics.median(pairs):.3f}",
                "ratio_pairs_max": f"{max(pairs):.3f}",
                "spread_pct": f"{spread:.1f}",
                "within_spread": "yes" if abs(ratio - 1.0) * 100.0 <= spread else "no",
                "note": "",
            }
        )
unavailable = os.path.join(work, "unavailable.csv")
if os.path.exists(unavailable):
    for line in open(unavailable):
        backend, _, why = line.strip().partition(",")
        rows.append({"backend": backend, "note": f"not measured: {why}"})

fields = [
    "backend", "size", "receivers", "clear_ns_per_copy", "clear_spread_pct", "clear_runs",
    "sealed_ns_per_copy", "sealed_spread_pct", "sealed_runs", "ratio", "ratio_pairs_min",
    "ratio_pairs_median", "ratio_pairs_max", "spread_pct", "within_spread", "note",
]
with open(os.path.join(results, "sealed_reflector.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, restval="")
    w.writeheader()
    w.writerows(rows)
for r in rows:
    if r.get("note"):
        print(f"sealed: reflector {r['backend']}: {r['note']}")
    else:
        print(
            f"sealed: reflector {r['backend']:8} {r['size']:>5} B x {r['receivers']}: clear {r['clear_ns_per_copy']} ns/copy, "
            f"sealed {r['sealed_ns_per_copy']} ns/copy, sealed/clear {r['ratio']} (pairs {r['ratio_pairs_min']}-"
            f"{r['ratio_pairs_max']}), spread {r['spread_pct']} %: within spread {r['within_spread']}"
        )

fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
labels, med, lo, hi = [], [], [], []
for r in client:
    labels.append(f"{r['direction']}\n{r['size']} B")
    m = float(r["ratio_median"])
    med.append(m)
    lo.append(m - float(r["ratio_min"]))
    hi.append(float(r["ratio_max"]) - m)
a.bar(range(len(med)), med, yerr=[lo, hi], capsize=4, color="tab:blue")
for i, r in enumerate(client):
    a.text(i, 0.05, f"{float(r['clear_ns_median']) / 1e3:.2f} us\nclear", ha="center", fontsize=7, color="white")
a.axhline(1.3, color="red", linestyle="--", label="1.3x (goal)")
a.axhline(1.0, color="gray", linestyle=":")
a.set_xticks(range(len(labels)), labels)
a.set_ylabel("client CPU per datagram, sealed / clear")
a.set_title("client: median of pairs (bars: min-max)", fontsize=10)
a.legend(fontsize=8)
measured = [r for r in rows if not r.get("note")]
if measured:
    x = range(len(measured))
    rat = [float(r["ratio"]) for r in measured]
    spr = [float(r["spread_pct"]) / 100.0 for r in measured]
    b.bar(x, rat, color="tab:green")
    b.errorbar(x, [1.0] * len(measured), yerr=spr, fmt="none", ecolor="black", capsize=4, label="1 +/- repetitions' spread")
    b.set_xticks(x, [f"{r['backend']}\n{r['size']} B" for r in measured])
    b.legend(fontsize=8)
skipped = [r for r in rows if r.get("note")]
if skipped:
    b.text(0.02, 0.02, "\n".join(f"{r['backend']}: {r['note']}" for r in skipped)[:300], transform=b.transAxes, fontsize=7)
b.axhline(1.0, color="gray", linestyle=":")
b.set_ylabel("reflector CPU per copy, sealed / clear group")
b.set_title("reflector (fanout-bench method, equal wire bytes)", fontsize=10)
fig.suptitle("Sealed groups vs clear groups, same run (anchor: the clear group)", fontsize=10)
fig.tight_layout()
fig.savefig(os.path.join(results, "sealed.png"), dpi=110)
print(f"wrote {os.path.join(results, 'sealed_reflector.csv')} and {os.path.join(results, 'sealed.png')}")
