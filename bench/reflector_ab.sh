#!/usr/bin/env bash
# Builds of the reflector on the same cells in one session, interleaved:
# A, B, (C, ...) A, B, ... each a full reflector-bench run (its own raw-loop
# anchor in the same run), so machine load drifts over all alike. Each build
# is driven by its own reflector-bench (the protocol may differ between them).
#
# Usage: bench/reflector_ab.sh BIN_DIR BIN_DIR... [--rounds 3] [--out FILE] [--keep DIR]
#          [-- reflector-bench args]
# Default bench args: --sizes 100,1000 --receivers 3,90 --repeat 1 --seconds 0.8.
# Prints per build, cell and implementation the median over rounds of the CPU
# per delivered copy as a ratio to that run's raw loop: of the process from
# its scheduler statistics (ns; "sched"), from its user+sys ticks ("ticks",
# coarse at 90 receivers) and machine-wide ("system"), and the raw loop's own
# ns per copy; writes them as CSV, and every run's CSV into --keep DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
dirs=()
while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do
  dirs+=("$(cd "$1" && pwd)")
  shift
done
rounds=3
out=bench/results/reflector_ab.csv
keep=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "reflector_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--sizes 100,1000 --receivers 3,90 --repeat 1 --seconds 0.8)
label() { git -C "$1" rev-parse --short HEAD 2>/dev/null || basename "$1"; }
labels=()
for i in "${!dirs[@]}"; do
  labels+=("$(printf "\\x$(printf %x $((65 + i)))"):$(label "${dirs[$i]}")")
done
if [ -n "$keep" ]; then
  mkdir -p "$keep"
  tmp=$(cd "$keep" && pwd)
else
  tmp=$(mktemp -d /tmp/reflector-ab.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
fi
csvs=()
for round in $(seq 1 "$rounds"); do
  for i in "${!dirs[@]}"; do
    dir=${dirs[$i]} lab=${labels[$i]} side=$i
    echo "reflector_ab.sh: round $round/$rounds, $lab ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
    "$dir/reflector-bench" --out "$tmp/$side-$round.csv" "${args[@]}" >"$tmp/$side-$round.log" 2>&1 || {
      echo "reflector_ab.sh: $lab failed:" >&2
      tail -n 20 "$tmp/$side-$round.log" >&2
      exit 1
    }
    csvs+=("$lab" "$tmp/$side-$round.csv")
  done
done
mkdir -p "$(dirname "$out")"
"${BENCH_PYTHON:-python3}" - "$out" "${csvs[@]}" <<'EOF'
import csv, statistics, sys
out, rest = sys.argv[1], sys.argv[2:]
rows = {}
for lab, path in zip(rest[::2], rest[1::2]):
    for r in csv.DictReader(open(path)):
        key = (int(r["payload_bytes"]), int(r["receivers"]), r["impl"], lab)
        rows.setdefault(key, []).append(r)
labels = list(dict.fromkeys(rest[::2]))
med = lambda rs, k: statistics.median(float(r[k]) for r in rs)
cols = [("sched", "ratio_sched_vs_raw"), ("ticks", "ratio_proc_vs_raw"), ("system", "ratio_system_vs_raw")]
print(f"{'':<29}" + "".join(f"{l:^33}" for l in labels))
print(f"{'bytes':>5} {'rcv':>4} {'impl':<18}" + "".join(f"{'sched':>8}{'ticks':>8}{'system':>8}{'raw ns':>9}" for _ in labels))
lines = ["payload_bytes,receivers,impl,build,rounds,ratio_sched_vs_raw,ratio_proc_vs_raw,ratio_system_vs_raw,sched_cpu_ns_per_copy,raw_sched_cpu_ns_per_copy"]
means = {}
for (size, rcv, imp) in sorted({k[:3] for k in rows}):
    cells = []
    for lab in labels:
        rs = rows.get((size, rcv, imp, lab))
        raw = rows.get((size, rcv, "raw-loop", lab))
        if not rs:
            cells.append(f"{'-':>8}{'-':>8}{'-':>8}{'-':>9}")
            continue
        v = [med(rs, k) for _, k in cols]
        rawns = med(raw, "sched_cpu_ns_per_copy")
        means.setdefault((imp, lab), []).append(v)
        cells.append("".join(f"{x:>8.3f}" for x in v) + f"{rawns:>9.0f}")
        lines.append(f"{size},{rcv},{imp},{lab},{len(rs)},{v[0]:.3f},{v[1]:.3f},{v[2]:.3f},{med(rs, 'sched_cpu_ns_per_copy'):.1f},{rawns:.1f}")
    print(f"{size:>5} {rcv:>4} {imp:<18}" + "".join(cells))
print("mean over cells:")
for imp in sorted({k[0] for k in means}):
    print(f"{'':>10} {imp:<18}" + "".join(
        ("".join(f"{statistics.mean(x[j] for x in means[(imp, lab)]):>8.3f}" for j in range(3)) + f"{'':>9}")
        if (imp, lab) in means else f"{'-':>8}{'-':>8}{'-':>8}{'':>9}" for lab in labels))
open(out, "w").write("\n".join(lines) + "\n")
print(f"medians over rounds; wrote {out}")
EOF
