#!/usr/bin/env bash
# Adaptive time dilation under a phased workload (paper 003, fig. 6 and
# table 1): linear:100 (100 switches in a line, one host on each), five
# disjoint TCP flows h1->h20, h21->h40, h41->h60, h61->h80, h81->h100 (iperf3
# inside the hosts). Phase 1: flow 1 alone; phase 2: all five; phase 3: flow 1
# alone again. Three cases: TDF 1 (no dilation), a fixed high TDF, and
# adaptive TDF (netlab run --adaptive-tdf, starting at 1). Every goodput is a
# ratio against the configured link rate (what each disjoint flow should
# get); the price of fidelity is the wall-clock time against the virtual
# duration of the experiment, reported beside it with the mean TDF.
# The paper ran 100 Mb/s links with 1 ms delay for 50/100/50 s; this machine
# forwards five such flows, even five at 1 Gb/s, at the configured rate, so
# the defaults are 4 Gb/s links (one flow fits, five do not), no delay, and
# 5/10/5 s phases (knobs below), which puts phase 2 beyond what it can
# emulate in real time.
# Writes bench/results/phased.csv, phased_tdf.csv and phased.png.
# Knobs: PHASED_BW (4gbit), PHASED_DELAY (none), PHASED_PHASE (5: phase 1
# and 3 in virtual seconds; phase 2 is twice as long), PHASED_FIXED_TDF (8),
# PHASED_ADAPT (1-12).
set -euo pipefail
cd "$(dirname "$0")/.."
NL=${NETLAB_BIN:-target/release/netlab}
OUT=bench/results
BW=${PHASED_BW:-4gbit}
DELAY=${PHASED_DELAY:-none}
P=${PHASED_PHASE:-5}
FIXED=${PHASED_FIXED_TDF:-8}
ADAPT=${PHASED_ADAPT:-1-12}
mkdir -p "$OUT"
[ "$(id -u)" -eq 0 ] || { echo "bench phased: needs root (namespaces, tc): run with sudo" >&2; exit 1; }
[ -x "$NL" ] || { echo "bench phased: $NL not built (run: make bench)" >&2; exit 1; }
if ! command -v iperf3 >/dev/null; then
  echo "bench phased: installing iperf3 (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3 >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"; "$NL" clean >/dev/null 2>&1 || true' EXIT
"$NL" clean >/dev/null
now() { date +%s.%N; }
total=$((4 * P))

scenario() {
  printf 'name = "phased workload"\n[topology]\nkind = "linear"\nswitches = 100\n'
  printf '[link]\nbw = "%s"\n' "$BW"
  [ "$DELAY" = none ] || printf 'delay = "%s"\n' "$DELAY"
  for f in 1 2 3 4 5; do
    printf '[[command]]\nhost = "h%s"\ncmd = "iperf3 -s -p %s"\nbackground = true\n' $((20 * f)) $((5300 + f))
  done
  # Clients start together; flows 2-5 wait out phase 1 with a (dilated)
  # sleep, so the phases are in the lab's virtual time whatever the TDF.
  for f in 1 2 3 4 5; do
    src=$((20 * f - 19)); dst=$((20 * f))
    if [ "$f" -eq 1 ]; then wait=0; secs=$total; else wait=$P; secs=$((2 * P)); fi
    printf '[[command]]\nhost = "h%s"\nat = "1s"\ntimeout = "%ss"\n' "$src" $((total * 20 + 120))
    printf 'cmd = "sleep %s; for i in $(seq 1 20); do iperf3 -c $NETLAB_IP_h%s -p %s -t %s -i 1 -J > %s/f%s.json && break; sleep 0.2; done"\n' \
      "$wait" "$dst" $((5300 + f)) "$secs" "$work" "$f"
  done
}

echo "case,tdf_mean,wall_s,virtual_s,flow,phase,goodput_mbit,ratio_to_configured" > "$OUT/phased.csv"
echo "case,seconds,busy,tdf" > "$OUT/phased_tdf.csv"
bw_mbit=$(echo "$BW" | awk '/gbit/ { print $1 * 1000; next } /mbit/ { print $1 + 0 }')
for spec in "tdf1 --tdf 1" "fixed --tdf $FIXED" "adaptive --adaptive-tdf $ADAPT"; do
  set -- $spec; case=$1; shift
  scenario > "$work/phased.toml"
  rm -f "$work"/f*.json; rm -rf "$work/out"
  echo "  case $case ($*): $total virtual seconds..."
  t0=$(now)
  "$NL" run "$work/phased.toml" "$@" --out "$work/out" -q > "$work/run.log" 2>&1 \
    || { echo "bench phased: netlab run failed:" >&2; tail -20 "$work/run.log" >&2; exit 1; }
  t1=$(now)
  wall=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
  tdf_mean=$(echo "$*" | awk '{ print $2 }')
  if [ -f "$work/out/tdf-trace.csv" ]; then
    # Time-weighted mean TDF of the trace (one sample per epoch).
    tdf_mean=$(awk -F, 'NR > 1 { if (n) s += ($1 - pt) * ptdf; pt = $1; ptdf = $3; n++ }
      END { printf "%.2f", (pt > 0 ? s / pt : ptdf) }' "$work/out/tdf-trace.csv")
    awk -F, -v c="$case" 'NR > 1 { print c "," $1 "," $2 "," $3 }' "$work/out/tdf-trace.csv" >> "$OUT/phased_tdf.csv"
  fi
  python3 - "$work" "$case" "$tdf_mean" "$wall" "$total" "$P" "$bw_mbit" >> "$OUT/phased.csv" <<'PY'
import json, sys
work, case, tdf, wall, total, p, bw = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
def intervals(f):
    try:
        j = json.load(open(f"{work}/f{f}.json"))
        return [(i["sum"]["start"], i["sum"]["bits_per_second"]) for i in j["intervals"]]
    except Exception:
        return []
# Flow 1's intervals by phase (its own clock: phase 2 is [p, 3p)); flows 2-5 run in phase 2 only.
phases = {1: (0, p), 2: (p, 3 * p), 3: (3 * p, 4 * p)}
for f in range(1, 6):
    iv = intervals(f)
    for ph, (a, b) in phases.items():
        if f > 1 and ph != 2:
            continue
        if f > 1:
            a, b = 0, 2 * p
        pts = [bps for (s, bps) in iv if a + 1 <= s < b - 1] or [bps for (s, bps) in iv if a <= s < b]
        mbit = sum(pts) / len(pts) / 1e6 if pts else 0.0
        print(f"{case},{tdf},{wall},{total},{f},{ph},{mbit:.1f},{mbit / bw:.4f}")
PY
  p2=$(awk -F, -v c="$case" '$1 == c && $6 == 2 { s += $8; n++ } END { printf "%.3f", s / n }' "$OUT/phased.csv")
  printf '  case %-8s mean TDF %-5s wall %6.1f s for %s virtual s (%.2fx); phase 2 mean goodput %s of configured\n' \
    "$case" "$tdf_mean" "$wall" "$total" "$(awk "BEGIN { print $wall / $total }")" "$p2"
done
"${BENCH_PYTHON:-python3}" bench/phased_plot.py "$OUT/phased.csv" "$OUT/phased_tdf.csv" "$OUT/phased.png"
