"""Plots of the netlab benchmark (bench/netlab.sh): build time, TCP
throughput through switch chains, delay-line accuracy."""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "bench/results"

# Mininet's own published setup times (Lantz et al., HotNets 2010, table 1;
# 2010 laptop VM, Open vSwitch): a reference point, not a same-run anchor.
MININET_SETUP_S = {"linear:100": 70.7, "fattree:4": 17.2}


def rows(name):
    with open(f"{out}/{name}") as f:
        return list(csv.DictReader(f))


fig, ax = plt.subplots(1, 4, figsize=(22, 5))

build = defaultdict(list)
for r in rows("netlab_build.csv"):
    build[(r["topology"], r["apply"])].append(float(r["up_s"]) + float(r["down_s"]))
topos = list(dict.fromkeys(t for t, _ in build))
x = range(len(topos))
w = 0.38
for i, mode in enumerate(["batch", "per-op"]):
    vals = [statistics.median(build[(t, mode)]) for t in topos]
    ax[0].bar([p + (i - 0.5) * w for p in x], vals, w, label=f"netlab, {mode} apply")
for t, s in MININET_SETUP_S.items():
    if t in topos:
        ax[0].plot(topos.index(t), s, "k*", ms=12)
ax[0].plot([], [], "k*", label="Mininet setup only (published, 2010)")
ax[0].set_xticks(list(x), topos)
ax[0].set_yscale("log")
ax[0].set_ylabel("up + down, seconds (median)")
ax[0].set_title("Build and tear-down time")
ax[0].legend(fontsize=8)

thr = defaultdict(list)
ceiling = []
for r in rows("netlab_throughput.csv"):
    if r["configured_mbit"] == "0":
        ceiling.append(float(r["goodput_mbit"]))
    else:
        thr[(int(r["configured_mbit"]), int(r["switches"]))].append(float(r["ratio_to_configured"]))
for bw in sorted({b for b, _ in thr}):
    ns = sorted(n for b, n in thr if b == bw)
    ax[1].plot(ns, [statistics.median(thr[(bw, n)]) for n in ns], "o-", label=f"{bw / 1000:g} Gb/s configured")
    if ceiling:
        ax[1].axhline(statistics.median(ceiling) / bw, ls=":", color="grey")
ax[1].axhline(1448 / 1514, ls="--", color="k", lw=0.8, label="TCP/IP framing limit (1448/1514)")
ax[1].set_xlabel("switches in the chain")
ax[1].set_ylabel("goodput / configured rate")
ax[1].set_ylim(0, 1.05)
ax[1].set_title("One TCP flow through chain(N)\n(dotted: unshaped veth pair / rate)")
ax[1].legend(fontsize=8)

d = rows("netlab_delay.csv")
tg = [int(r["target_us"]) for r in d]
labels = [f"{t} us" if t else "none" for t in tg]
med = [float(r["median_us"]) for r in d]
p99 = [float(r["p99_us"]) for r in d]
mn = [float(r["min_us"]) for r in d]
ax[2].bar(range(len(d)), [m - t for m, t in zip(med, tg)], 0.5, label="median - target")
ax[2].plot(range(len(d)), [p - t for p, t in zip(p99, tg)], "rv", label="p99 - target")
ax[2].plot(range(len(d)), [m - t for m, t in zip(mn, tg)], "g^", label="min - target")
ax[2].set_xticks(range(len(d)), labels)
ax[2].set_ylabel("one-way latency above target, us")
ax[2].set_title("Delay line accuracy (UDP RTT / 2)")
ax[2].legend(fontsize=8)

cost = defaultdict(list)
for r in rows("netlab_delayline_tput.csv"):
    cost[(r["config"], r["anchor"])].append(float(r["ratio_to_anchor"]))
names = list(cost)
ax[3].bar(range(len(names)), [statistics.median(cost[n]) for n in names], 0.5)
ax[3].set_xticks(range(len(names)), [f"{c}\n/ {a}".replace(" bw ", "\n") for c, a in names], fontsize=8)
ax[3].axhline(1448 / 1514, ls="--", color="k", lw=0.8)
ax[3].set_ylabel("TCP goodput / anchor")
ax[3].set_title("One TCP flow through the delay line")

fig.tight_layout()
fig.savefig(f"{out}/netlab.png", dpi=110)
print(f"wrote {out}/netlab.png")
