#!/usr/bin/env bash
# In-kernel fan-out benchmark (paper 000 §4-5 over veth): the reflector's
# sendto, sendmmsg and ebpf backends, native IP multicast and the raw sendto
# loop (the anchors), datagram size x
# receivers. The figure is ns of CPU per copy at saturation of one measured
# CPU that carries all of the implementation's work (the process pinned
# there, the veth's receive softirq steered there with RPS; the sender on the
# other CPU), nothing subtracted; each cell with its repetitions' spread;
# throughput and loss from paced delivery phases; then the plot. Needs root
# and 2 CPUs. Builds nothing: `make bench` builds the release binaries first.
# Extra arguments for fanout-bench may be given in FANOUT_BENCH_ARGS
# (e.g. FANOUT_BENCH_ARGS="--sizes 100,1000 --receivers 3,90,256" make bench BENCH=fanout).
# The full grid (3 repetitions) takes about 15 minutes on a quiet machine;
# bench/fanout_repro.sh runs it several times and checks that the runs agree.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/fanout-bench"
if [ ! -x "$bin" ]; then
  echo "fanout.sh: $bin is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "fanout.sh: needs root (namespaces, BPF programs); skipped" >&2
  exit 0
fi
out=bench/results/fanout.csv
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$bin" --out "$out" ${FANOUT_BENCH_ARGS:-} "$@"
"${BENCH_PYTHON:-python3}" bench/fanout_plot.py "$out" bench/results/fanout.png
