#!/usr/bin/env bash
# wire benchmark (paper 004): wire against bincode, postcard, bitcode, rkyv
# and prost on the cpp-serializers Record, and one-buffer records of 4 KiB to
# 16 MiB (serialize time, and end to end over a TCP socket pair on 127.0.0.1
# against bincode + a plain write), in one run. The peer serializers live in
# bench/wire-bench, a crate of its own that only this script builds, so
# `make test` never compiles them. Writes bench/results/wire_record.csv,
# wire_buffers.csv and wire.png.
set -euo pipefail
cd "$(dirname "$0")/.."
(cd bench/wire-bench && cargo build --release --quiet)
mkdir -p bench/results
bench/wire-bench/target/release/wire-bench bench/results
"${BENCH_PYTHON:-python3}" bench/wire_plot.py bench/results/wire_record.csv bench/results/wire_buffers.csv bench/results/wire.png
