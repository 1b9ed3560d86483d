#!/usr/bin/env bash
# Reflector benchmark (paper 000 §5): each fan-out backend of `reflector serve`
# vs a raw sendto loop, datagram size x receivers, then the plot.
# Builds nothing: `make bench` builds the release binaries first.
# Extra arguments for reflector-bench may be given in REFLECTOR_BENCH_ARGS
# (e.g. REFLECTOR_BENCH_ARGS=--quick make bench BENCH=reflector).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/reflector-bench"
if [ ! -x "$bin" ]; then
  echo "reflector.sh: $bin is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 1
fi
out=bench/results/reflector.csv
rc=0
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$bin" --out "$out" ${REFLECTOR_BENCH_ARGS:-} "$@" || rc=$?
# Exit status 3 means copies were lost: the results are still written and
# worth plotting, and the non-zero status is passed on afterwards.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
  exit "$rc"
fi
"${BENCH_PYTHON:-python3}" bench/reflector_plot.py "$out" bench/results/reflector.png
exit "$rc"
