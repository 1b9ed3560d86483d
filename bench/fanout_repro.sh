#!/usr/bin/env bash
# Reproducibility check of the fan-out benchmark (three full runs should
# agree within ±10 % per cell): runs fanout-bench N times (default 3) over
# the same grid, keeps each run's CSV under bench/results/fanout_repro/,
# then prints per cell the spread across runs of ns per copy and of
# clock-probe steps per copy (the same windows divided by the measured CPU's
# speed, read around each phase), writes summary.csv there and exits
# non-zero if any cell's figure in steps (the judged one; fanout_repro.py
# says why) is more than ±10 % (FANOUT_REPRO_TOLERANCE) from the median
# across runs; cells where the
# sender could not saturate the measured CPU are shown but not counted
# (bench/fanout_repro.py). Run it on a quiet machine: 3 full default grids
# take about 45 minutes; the committed checks ran
#   bench/fanout_repro.sh 3 --sizes 100,1000 --receivers 3,90 --repeat 9 --seconds 1.2 \
#     --impls raw-loop,sendto,sendmmsg,ebpf,multicast --interleave
# (about 7.5 minutes a run). Extra arguments go to fanout-bench. Needs root; builds
# nothing (`make bench` first). Not part of bench/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
n=3
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
  n=$1
  shift
fi
if [ "$n" -lt 2 ]; then
  echo "fanout_repro.sh: needs at least 2 runs" >&2
  exit 2
fi
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/fanout-bench"
if [ ! -x "$bin" ]; then
  echo "fanout_repro.sh: $bin is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "fanout_repro.sh: needs root (namespaces, BPF programs)" >&2
  exit 2
fi
dir=bench/results/fanout_repro
mkdir -p "$dir"
csvs=()
start=$(date +%s)
for i in $(seq 1 "$n"); do
  echo "=== fanout_repro: run $i of $n ===" >&2
  out="$dir/run$i.csv"
  "$bin" --out "$out" "$@"
  csvs+=("$out")
done
echo "=== fanout_repro: $n runs in $(( $(date +%s) - start )) s ===" >&2
python3 bench/fanout_repro.py --tolerance "${FANOUT_REPRO_TOLERANCE:-10}" --out "$dir/summary.csv" "${csvs[@]}"
