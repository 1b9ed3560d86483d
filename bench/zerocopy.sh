#!/usr/bin/env bash
# Zero-copy send benchmark (paper 001 fig. 3, as far as this machine can show
# it): send-side CPU per KiB for copied sends, MSG_ZEROCOPY and io_uring
# SEND_ZC from registered buffers, UDP with GSO from 4 KiB to 64 KiB per
# send, into a sink where packets leave without local delivery (a TC program
# drops them on the sending veth, so completions come back uncopied), modes
# alternating, REPS repetitions. Needs root (a namespace of its own, removed
# at the end). Writes bench/results/zerocopy_runs.csv (every run),
# zerocopy.csv (medians, ratios to copy, crossover) and zerocopy.png.
# ZC_BENCH_SECS and ZC_BENCH_REPS override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/zerocopy-bench"
[ -x "$bin" ] || cargo build --release -p bench --bin zerocopy-bench
mkdir -p bench/results
pin=()
command -v taskset >/dev/null && pin=(taskset -c 1)
"${pin[@]}" "$bin" --secs "${ZC_BENCH_SECS:-2}" --reps "${ZC_BENCH_REPS:-3}" --out bench/results/zerocopy_runs.csv
"${BENCH_PYTHON:-python3}" bench/zerocopy_plot.py bench/results
