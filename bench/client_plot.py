"""Plots bench/client.sh's results: CPU per received datagram of each
receiver, each repetition, and the client/raw ratio, from client.csv."""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
by = defaultdict(list)
for r in rows:
    by[r["receiver"]].append(r)
names = [n for n in ("raw-recvmmsg", "client-mmsg", "client-std") if n in by]
first = rows[0]
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
for i, n in enumerate(names):
    v = [float(r["ns_per_datagram"]) for r in by[n]]
    a.bar(i, statistics.median(v), color=["tab:gray", "tab:blue", "tab:orange"][i])
    a.scatter([i] * len(v), v, color="black", s=10, zorder=3)
a.set_xticks(range(len(names)), names)
a.set_ylabel("receiving thread CPU per datagram (ns)")
a.set_title("median of repetitions (dots: each)", fontsize=10)
for n in names[1:]:
    b.plot(
        [int(r["rep"]) for r in by[n]],
        [float(r["ratio_vs_raw"]) for r in by[n]],
        marker="o",
        label=n,
    )
b.axhline(1.2, color="red", linestyle="--", label="1.2x (criterion)")
b.axhline(1.0, color="gray", linestyle=":")
b.set_xticks(sorted({int(r["rep"]) for r in rows}))
b.set_xlabel("repetition")
b.set_ylabel("CPU per datagram / raw recvmmsg loop")
b.set_ylim(bottom=0)
b.legend(fontsize=8)
fig.suptitle(
    f"reflector-client receive cost vs a raw recvmmsg loop, same traffic: {first['senders']} senders x "
    f"{first['rate_per_sender']}/s x {first['size']} B, frame {first['frame_us']} us, {first['secs']} s windows",
    fontsize=9,
)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
