"""Plots the demo's per-backend results: reflector CPU per arrived datagram
and one-way latency (p50/p99), from the JSON `reflector-demo --json` writes
({"parameters": str, "cpu_note": str or null, "rows": [...]})."""
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
names = [r["backend"] for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.6))
a.bar(names, [r["cpu_ns_per_delivered"] / 1000 for r in rows], color="tab:blue")
a.set_ylabel("reflector CPU per arrived datagram (µs)")
a.set_title("CPU: user+sys of the reflector process", fontsize=10)
x = range(len(rows))
b.bar([i - 0.2 for i in x], [r["p50_us"] for r in rows], width=0.4, label="p50")
b.bar([i + 0.2 for i in x], [r["p99_us"] for r in rows], width=0.4, label="p99")
b.set_xticks(list(x), names)
b.set_ylabel("one-way latency (µs)")
b.set_title("latency, bot to bot through the reflector", fontsize=10)
b.legend()
lost = sum(r["lost"] for r in rows)
arrived = sum(r["arrived"] for r in rows)
title = textwrap.wrap(doc["parameters"], 110) + [f"{arrived} datagrams arrived, {lost} lost"]
fig.suptitle("\n".join(title), fontsize=9)
if doc.get("cpu_note"):
    fig.text(0.01, 0.01, "\n".join(textwrap.wrap(doc["cpu_note"], 150)), fontsize=7, va="bottom")
fig.tight_layout(rect=(0, 0.08 if doc.get("cpu_note") else 0, 1, 1))
fig.savefig(sys.argv[2], dpi=110)
