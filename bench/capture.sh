#!/usr/bin/env bash
# Capture benchmark (paper 002 on veth): our modes against tcpdump (default and
# --immediate-mode) and netsniff-ng measured in the same run. Writes
# bench/results/capture_*.csv and capture_*.png. Needs root (namespaces).
# CAPTURE_BENCH_QUICK=1 runs a shorter sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "bench/capture.sh: needs root (it creates network namespaces): run with sudo" >&2
  exit 1
fi
for t in tcpdump netsniff-ng taskset ip; do
  command -v "$t" >/dev/null || { echo "bench/capture.sh: $t not found (run scripts/install-deps.sh)" >&2; exit 1; }
done
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/capture
netlab=$target/release/netlab
# The lab (a netlab pair, its monitor port) and every process in it come from netlab.
cargo build --release -p capture -p netlab
py=${BENCH_PYTHON:-}
if [ -z "$py" ]; then
  # Run directly (not from bench/run.sh): use the same private virtualenv.
  venv=target/bench-venv
  [ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib; }
  py=$venv/bin/python
fi
quick=()
[ "${CAPTURE_BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
mkdir -p bench/results
# The driver's lab is owned by a `netlab run` that removes it when the driver ends, however it ends.
python3 bench/capture_bench.py "$bin" "$netlab" bench/results "${quick[@]}"
"$py" bench/capture_plot.py bench/results
