#!/usr/bin/env bash
# ECMP case study (paper 003, fig. 10/11): a k=4 fat tree of ECMP routers
# (L4 hashing, a different fixed hash seed per router), 8 simultaneous TCP
# flows (iperf3) from h1..h8, host x sending to host x+stride (mod 16):
#   stride 1 -> mostly inside an edge switch or pod (few shared uplinks)
#   stride 4 -> every flow leaves its pod, so hash collisions on the
#               aggregation/core links decide what each flow gets.
# Cases: 100 Mb/s links at TDF 1, 10 Gb/s links at TDF 1 (this machine cannot
# forward 8 x 10 Gb/s through 4-6 namespace hops on 2 cores), and 10 Gb/s at
# TDF 4 (links re-rated to 2.5 Gb/s, the lab's clock 4x slower, so iperf3
# inside the lab measures virtual-time throughput against 10 Gb/s).
# Every figure is a ratio against the configured link rate (the anchor),
# which is what one flow would get on an uncontended path.
# Writes bench/results/ecmp.csv (per flow) and ecmp.png.
# Knobs: ECMP_SECS (virtual seconds per run, default 5), ECMP_REPS (default 1),
# ECMP_SEED (ECMP hash seed, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
NL=${NETLAB_BIN:-target/release/netlab}
OUT=bench/results
SECS=${ECMP_SECS:-5}
REPS=${ECMP_REPS:-1}
SEED=${ECMP_SEED:-1}
mkdir -p "$OUT"
[ "$(id -u)" -eq 0 ] || { echo "bench ecmp: needs root (namespaces, tc): run with sudo" >&2; exit 1; }
[ -x "$NL" ] || { echo "bench ecmp: $NL not built (run: cargo build --release -p netlab)" >&2; exit 1; }
# iperf3 is a benchmark-only dependency: installed here, never by make test.
if ! command -v iperf3 >/dev/null; then
  echo "bench ecmp: installing iperf3 (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3 >/dev/null
fi

trap '"$NL" clean >/dev/null 2>&1 || true' EXIT
"$NL" clean >/dev/null


echo "case,configured_mbit,tdf,stride,rep,flow,src,dst,mbit,ratio_to_configured" > "$OUT/ecmp.csv"
work=$(mktemp -d)
trap 'rm -rf "$work"; "$NL" clean >/dev/null 2>&1 || true' EXIT

# case label, configured Mbit/s, TDF
for spec in "100M-tdf1 100 1" "10G-tdf1 10000 1" "10G-tdf4 10000 4"; do
  set -- $spec; label=$1; bw=$2; tdf=$3
  for stride in 1 4; do
    for rep in $(seq 1 "$REPS"); do
      # netlab run (not up): a dilated lab needs its owner alive for its clock.
      sc="$work/ecmp.toml"
      {
        printf 'name = "ecmp %s stride %s"\n[topology]\nkind = "fattree"\nk = 4\n' "$label" "$stride"
        printf '[link]\nbw = "%smbit"\n[options]\necmp_seed = %s\ntdf = %s\n' "$bw" "$SEED" "$tdf"
        for x in $(seq 1 8); do
          d=$(( (x - 1 + stride) % 16 + 1 ))
          # One server per flow, killed by netlab at the end of the run.
          printf '[[command]]\nhost = "h%s"\ncmd = "iperf3 -s -p %s"\nbackground = true\n' "$d" $((5200 + x))
        done
        for x in $(seq 1 8); do
          d=$(( (x - 1 + stride) % 16 + 1 ))
          # Started together; a bounded retry covers a server not yet listening.
          printf '[[command]]\nhost = "h%s"\nat = "1s"\ntimeout = "%ss"\n' "$x" $((SECS * tdf * 4 + 60))
          printf 'cmd = "for i in $(seq 1 20); do iperf3 -c $NETLAB_IP_h%s -p %s -t %s -J > %s/f%s.json && break; sleep 0.2; done"\n' \
            "$d" $((5200 + x)) "$SECS" "$work" "$x"
        done
      } > "$sc"
      rm -f "$work"/f*.json
      "$NL" run "$sc" -q > "$work/run.log" 2>&1 || { echo "bench ecmp: netlab run failed:" >&2; tail -20 "$work/run.log" >&2; exit 1; }
      sum=0
      for x in $(seq 1 8); do
        d=$(( (x - 1 + stride) % 16 + 1 ))
        # Receiver-side goodput from iperf3's JSON (bits per second of the lab's clock).
        bps=$(python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])
except Exception: print(0)' "$work/f$x.json")
        mbit=$(awk "BEGIN { printf \"%.2f\", $bps / 1e6 }")
        r=$(awk "BEGIN { printf \"%.4f\", $mbit / $bw }")
        echo "$label,$bw,$tdf,$stride,$rep,$x,h$x,h$d,$mbit,$r" >> "$OUT/ecmp.csv"
        sum=$(awk "BEGIN { print $sum + $r }")
      done
      printf '  %-9s stride %s rep %s: average %.3f of configured per flow\n' "$label" "$stride" "$rep" "$(awk "BEGIN { print $sum / 8 }")"
    done
  done
done
"${BENCH_PYTHON:-python3}" bench/ecmp_plot.py "$OUT/ecmp.csv" "$OUT/ecmp.png"
