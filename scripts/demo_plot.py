"""Plots the demo's per-backend results: reflector CPU per delivered datagram
and one-way latency (p50/p99), from the JSON `reflector-demo --json` writes."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = json.load(open(sys.argv[1]))
names = [r["backend"] for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
a.bar(names, [r["cpu_ns_per_delivered"] / 1000 for r in rows], color="tab:blue")
a.set_ylabel("reflector CPU per delivered datagram (µs)")
a.set_title("CPU (user+sys of the reflector process)")
x = range(len(rows))
b.bar([i - 0.2 for i in x], [r["p50_us"] for r in rows], width=0.4, label="p50")
b.bar([i + 0.2 for i in x], [r["p99_us"] for r in rows], width=0.4, label="p99")
b.set_xticks(list(x), names)
b.set_ylabel("one-way latency (µs)")
b.set_title("latency, bot to bot through the reflector")
b.legend()
lost = sum(r["lost"] for r in rows)
fig.suptitle(
    f"reflector demo: {sum(r['received'] for r in rows)} datagrams delivered, {lost} lost"
)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
