#!/usr/bin/env bash
# Client receive benchmark (the client library issue's criterion): CPU per
# received datagram of reflector-client over its Linux recvmmsg driver (and
# over a std socket) against a raw recvmmsg loop receiving the same traffic
# from one loopback reflector at the same time. Writes bench/results/client.csv
# (every receiver of every repetition) and client.png.
# CLIENT_BENCH_ARGS adds arguments (see `client-bench --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/client-bench"
if [ ! -x "$bin" ] || [ ! -x "$target_dir/release/reflector" ]; then
  echo "client.sh: $bin or the reflector is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 1
fi
mkdir -p bench/results
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$bin" --out bench/results/client.csv ${CLIENT_BENCH_ARGS:-} "$@"
"${BENCH_PYTHON:-python3}" bench/client_plot.py bench/results/client.csv bench/results/client.png
