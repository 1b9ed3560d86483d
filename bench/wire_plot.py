"""Plots wire_record.csv and wire_buffers.csv (written by bench/wire.sh)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rec, buf, out = sys.argv[1], sys.argv[2], sys.argv[3]
rows = list(csv.DictReader(open(rec)))
brows = list(csv.DictReader(open(buf)))
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
names = [r["serializer"] for r in rows]
x = range(len(names))
a.bar([i - 0.2 for i in x], [float(r["serialize_ns"]) / 1000 for r in rows], 0.4, label="serialize")
a.bar([i + 0.2 for i in x], [float(r["deserialize_ns"]) / 1000 for r in rows], 0.4, label="deserialize")
a.set_xticks(list(x))
a.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
a.set_ylabel("µs per Record (median)")
a.set_title("cpp-serializers Record: 1,000 int64 + 100 strings")
a.legend()
sizes = [int(r["buffer_bytes"]) for r in brows]
b.loglog(sizes, [float(r["wire_serialize_ns"]) for r in brows], "o-", label="wire serialize")
b.loglog(sizes, [float(r["bincode_serialize_ns"]) for r in brows], "o-", label="bincode serialize")
b.loglog(sizes, [float(r["wire_e2e_us"]) * 1000 for r in brows], "s--", label="wire end to end (TCP)")
b.loglog(sizes, [float(r["bincode_e2e_us"]) * 1000 for r in brows], "s--", label="bincode + write (TCP)")
b.set_xlabel("buffer bytes")
b.set_ylabel("ns per message")
b.set_title("one shared buffer: referenced (wire) vs copied (bincode)")
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out, dpi=110)
