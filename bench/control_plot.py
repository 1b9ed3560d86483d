"""Reads bench/control.sh's runs (wrk outputs and server CPU), writes
control.csv (every run), control_summary.csv (medians, ratios to /healthz)
and control.png."""
import csv
import re
import statistics
import sys
from pathlib import Path

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text}")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_wrk(path):
    out = Path(path).read_text()
    row = {}
    row["requests"] = int(re.search(r"(\d+) requests in", out).group(1))
    row["req_per_s"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    for pct in ("50", "90", "99"):
        row[f"p{pct}_ms"] = ms(re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    row["non_2xx"] = int(bad.group(1)) if bad else 0
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    row["socket_errors"] = sum(int(x) for x in errs.groups()) if errs else 0
    return row


def main(runs_csv, out_dir):
    out_dir = Path(out_dir)
    rows = []
    with open(runs_csv) as f:
        for r in csv.DictReader(f):
            w = parse_wrk(r["wrk_output"])
            cpu = float(r["server_cpu_s"])
            rows.append(
                {
                    "endpoint": r["endpoint"],
                    "rep": int(r["rep"]),
                    "connections": int(r["connections"]),
                    **w,
                    "server_cpu_us_per_req": 1e6 * cpu / max(w["requests"], 1),
                }
            )
    fields = list(rows[0].keys())
    with open(out_dir / "control.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})

    def med(endpoint, key):
        return statistics.median(r[key] for r in rows if r["endpoint"] == endpoint)

    keys = ["req_per_s", "p50_ms", "p90_ms", "p99_ms", "server_cpu_us_per_req"]
    summary = []
    for e in ("healthz", "join"):
        s = {"endpoint": e, "connections": rows[0]["connections"]}
        for k in keys:
            s[k] = med(e, k)
            s[f"{k}_x_healthz"] = s[k] / med("healthz", k)
        s["non_2xx"] = sum(r["non_2xx"] for r in rows if r["endpoint"] == e)
        s["socket_errors"] = sum(r["socket_errors"] for r in rows if r["endpoint"] == e)
        summary.append(s)
    with open(out_dir / "control_summary.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        wr.writeheader()
        for s in summary:
            wr.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in s.items()})
    for s in summary:
        print(
            f"  /{s['endpoint']:<8} {s['req_per_s']:>9.0f} req/s ({s['req_per_s_x_healthz']:.2f}x /healthz)"
            f"  p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms ({s['p99_ms_x_healthz']:.2f}x)"
            f"  server CPU {s['server_cpu_us_per_req']:.1f} us/req ({s['server_cpu_us_per_req_x_healthz']:.2f}x)"
            f"  non-2xx {s['non_2xx']}  socket errors {s['socket_errors']}"
        )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = [f"/{s['endpoint']}" for s in summary]
    a.bar(names, [s["req_per_s"] for s in summary], color=["#999", "#1f77b4"])
    a.set_ylabel("requests per second (median)")
    a.set_title(f"{summary[0]['connections']} concurrent clients, server on one core")
    x = range(len(summary))
    for i, (pct, color) in enumerate([("p50", "#9ecae1"), ("p90", "#4292c6"), ("p99", "#08519c")]):
        b.bar([j + (i - 1) * 0.25 for j in x], [s[f"{pct}_ms"] for s in summary], 0.25, label=pct, color=color)
    b.set_xticks(list(x), names)
    b.set_ylabel("latency, ms (median of runs)")
    b.legend()
    b.set_title("latency percentiles (wrk)")
    fig.tight_layout()
    fig.savefig(out_dir / "control.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
