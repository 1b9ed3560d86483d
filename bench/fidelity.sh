#!/usr/bin/env bash
# Fidelity of a chain of switches (paper 003, fig. 4/5): one TCP flow (iperf3
# inside the hosts) from h1 to h2 through chain:N, N = 10, 40, 100 switches,
# at 4 and 10 Gb/s configured, without time dilation (TDF 1) and at TDF 4
# (links re-rated to rate/4 in real time, the lab's clock 4x slower, so
# iperf3 measures virtual-time throughput against the configured rate).
# Every figure is a ratio against the configured rate (the anchor: what the
# flow should get), beside the run's wall-clock time (the price of dilation).
# Writes bench/results/fidelity.csv and fidelity.png.
# Knobs: FIDELITY_SECS (virtual seconds per flow, default 5), FIDELITY_REPS
# (default 1), FIDELITY_SWITCHES (default "10 40 100").
set -euo pipefail
cd "$(dirname "$0")/.."
NL=${NETLAB_BIN:-target/release/netlab}
OUT=bench/results
SECS=${FIDELITY_SECS:-5}
REPS=${FIDELITY_REPS:-1}
SWITCHES=${FIDELITY_SWITCHES:-10 40 100}
mkdir -p "$OUT"
[ "$(id -u)" -eq 0 ] || { echo "bench fidelity: needs root (namespaces, tc): run with sudo" >&2; exit 1; }
[ -x "$NL" ] || { echo "bench fidelity: $NL not built (run: make bench)" >&2; exit 1; }
# iperf3 is a benchmark-only dependency: installed here, never by make test.
if ! command -v iperf3 >/dev/null; then
  echo "bench fidelity: installing iperf3 (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3 >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"; "$NL" clean >/dev/null 2>&1 || true' EXIT
"$NL" clean >/dev/null

now() { date +%s.%N; }
echo "switches,configured_mbit,tdf,rep,goodput_mbit,ratio_to_configured,wall_s" > "$OUT/fidelity.csv"
for bw in 4000 10000; do
  for n in $SWITCHES; do
    for tdf in 1 4; do
      for rep in $(seq 1 "$REPS"); do
        sc="$work/chain.toml"
        {
          printf 'name = "fidelity chain %s at %s Mbit/s, TDF %s"\n' "$n" "$bw" "$tdf"
          printf '[topology]\nkind = "chain"\nswitches = %s\n[link]\nbw = "%smbit"\n[options]\ntdf = %s\n' "$n" "$bw" "$tdf"
          printf '[[command]]\nhost = "h2"\ncmd = "iperf3 -s -p 5201"\nbackground = true\n'
          # A bounded retry covers a server not yet listening.
          printf '[[command]]\nhost = "h1"\nat = "1s"\ntimeout = "%ss"\n' $((SECS * tdf * 4 + 60))
          printf 'cmd = "for i in $(seq 1 20); do iperf3 -c $NETLAB_IP_h2 -p 5201 -t %s -J > %s/flow.json && break; sleep 0.2; done"\n' \
            "$SECS" "$work"
        } > "$sc"
        rm -f "$work/flow.json"
        t0=$(now)
        "$NL" run "$sc" -q > "$work/run.log" 2>&1 || { echo "bench fidelity: netlab run failed:" >&2; tail -20 "$work/run.log" >&2; exit 1; }
        t1=$(now)
        # Receiver-side goodput from iperf3's JSON (bits per second of the lab's clock).
        bps=$(python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])
except Exception: print(0)' "$work/flow.json")
        mbit=$(awk "BEGIN { printf \"%.1f\", $bps / 1e6 }")
        r=$(awk "BEGIN { printf \"%.4f\", $mbit / $bw }")
        wall=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
        echo "$n,$bw,$tdf,$rep,$mbit,$r,$wall" >> "$OUT/fidelity.csv"
        printf '  chain:%-3s %5s Mbit/s TDF %s rep %s: %8.1f Mbit/s = %.3f of configured, %5.1f s wall\n' \
          "$n" "$bw" "$tdf" "$rep" "$mbit" "$r" "$wall"
      done
    done
  done
done
"${BENCH_PYTHON:-python3}" bench/fidelity_plot.py "$OUT/fidelity.csv" "$OUT/fidelity.png"
