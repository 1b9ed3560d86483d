#!/usr/bin/env python3
"""Draws the capture benchmark figures from bench/results/capture_runs.csv."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(OUT, "capture_runs.csv"))))
METHOD = ("64-byte broadcast UDP frames over veth (capture gen --via txring), 2 MiB ring for every tool,\n"
          "output pcap to /dev/null; CPU = capture process user+sys (wait4); anchors measured in the same run")


def sel(exp, tool=None):
    return [r for r in rows if r["experiment"] == exp and (tool is None or r["tool"] == tool)]


def tools_of(exp):
    seen = []
    for r in sel(exp):
        if r["tool"] not in seen:
            seen.append(r["tool"])
    return seen


STYLE = {"tcpdump": "k--", "tcpdump-immediate": "k:", "netsniff-ng": "c-.",
         "capture-recv": "g-o", "capture-v2": "r-s", "capture-v3": "b-^", "capture-xdp": "m-D"}


def rate_figure(exp, png, title, per_cpu_second):
    """Captured fraction and CPU (per packet, or packets per CPU second) vs offered rate."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    for t in tools_of(exp):
        rs = sorted(sel(exp, t), key=lambda r: float(r["offered_pps"]))
        x = [float(r["offered_pps"]) / 1e3 for r in rs]
        ns = [float(r["cpu_ns_per_pkt"] or 0) for r in rs]
        a1.plot(x, [100 * float(r["captured_frac"]) for r in rs], STYLE.get(t, "-"), label=t)
        a2.plot(x, [1e6 / n if n else 0 for n in ns] if per_cpu_second else ns, STYLE.get(t, "-"), label=t)
    a1.set_xlabel("offered rate (kpps, as achieved by the generator)")
    a1.set_ylabel("captured (% of sent)")
    a1.set_ylim(0, 105)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    a2.set_xlabel("offered rate (kpps)")
    a2.set_ylabel("packets captured per CPU second of the capture (k)" if per_cpu_second
                  else "CPU per captured packet (ns, user+sys)")
    a2.set_yscale("log")
    a2.grid(alpha=0.3)
    fig.suptitle(title + "\n" + METHOD, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, png), dpi=110)


# 1. Captured fraction and CPU per packet vs offered rate.
rate_figure("rate", "capture_rate.png", "capture vs tcpdump / netsniff-ng (paper 002 fig. 12 style)", False)
# 1b. The same on a monitor port (tc mirred), where the xdp mode can run.
if sel("mirror"):
    rate_figure("mirror", "capture_mirror.png",
                "on a monitor port fed by tc mirred: AF_XDP (copy mode on veth) beside the AF_PACKET modes "
                "and tcpdump", True)

# 2. packzip: compression level vs captured fraction, per mode.
fig, ax = plt.subplots(figsize=(8, 5))
for t in tools_of("packzip"):
    rs = sel("packzip", t)
    labels = [r["param"] for r in rs]
    ax.plot(range(len(rs)), [100 * float(r["captured_frac"]) for r in rs], STYLE.get(t, "-"), label=t)
ax.set_xticks(range(len(labels)))
ax.set_xticklabels(labels)
ax.set_xlabel("--compress zlib level (none = no compression)")
ax.set_ylabel("captured (% of sent)")
ax.set_ylim(0, 105)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
ax.set_title("application load (paper 4.3 packzip) at the generator's maximum rate", fontsize=9)
fig.tight_layout()
fig.savefig(os.path.join(OUT, "capture_packzip.png"), dpi=110)

# 3/4. Scheduling and concurrent processes: grouped bars.
for exp, fname, title, xlabel in [
        ("sched", "capture_sched.png", "CPU placement at 200 kpps (paper fig. 5)", "placement"),
        ("multi", "capture_multi.png", "concurrent capture processes at 200 kpps (paper fig. 9)",
         "processes (mean per process)")]:
    fig, ax = plt.subplots(figsize=(8, 5))
    ts = tools_of(exp)
    params = []
    for r in sel(exp):
        if r["param"] not in params:
            params.append(r["param"])
    w = 0.8 / max(1, len(ts))
    for i, t in enumerate(ts):
        vals = []
        for p in params:
            m = [r for r in sel(exp, t) if r["param"] == p]
            vals.append(100 * float(m[0]["captured_frac"]) if m else 0)
        ax.bar([j + i * w for j in range(len(params))], vals, w, label=t)
    ax.set_xticks([j + w * (len(ts) - 1) / 2 for j in range(len(params))])
    ax.set_xticklabels(params)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("captured (% of sent)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, fname), dpi=110)
print("plots written to", OUT)
