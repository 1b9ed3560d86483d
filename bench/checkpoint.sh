#!/usr/bin/env bash
# Checkpoint hand-off (paper 000 §3 over the send path of paper 001): the
# time and the reflector's CPU to serve an N MiB checkpoint to K joiners at
# once over a veth, with the channel's MSG_ZEROCOPY on and off; then the
# plot. Needs root. Builds nothing: `make bench` builds the release binaries
# first. Extra arguments for checkpoint-bench in CHECKPOINT_BENCH_ARGS (e.g.
# CHECKPOINT_BENCH_ARGS="--sizes-mib 8 --joiners 1,32").
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/checkpoint-bench"
if [ ! -x "$bin" ]; then
  echo "checkpoint.sh: $bin is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "checkpoint.sh: needs root (namespaces); skipped" >&2
  exit 0
fi
out=bench/results/checkpoint.csv
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$bin" --out "$out" ${CHECKPOINT_BENCH_ARGS:-} "$@"
"${BENCH_PYTHON:-python3}" bench/checkpoint_plot.py "$out" bench/results/checkpoint.png
