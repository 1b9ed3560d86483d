#!/usr/bin/env bash
# Sealed-traffic benchmark (protocol 2.2, "Sealed payloads"): what sealing
# costs the client, and that it costs the reflector nothing.
#
# Client (sealed-bench; its --help prints the full method): one loopback
# reflector with two groups, both with the instance flag, one announced
# sealed. For 100 B and 1,000 B payloads, repetitions alternate clear and
# sealed; in each a fresh sender and receiver client join the mode's group.
# CPU per SENT datagram: the sending thread's CPU time (CLOCK_THREAD_CPUTIME_ID,
# to the ns; getrusage's thread time only advances at context switches and
# ticks, too coarse for one burst) around its bursts of Client::send (seal + tag + sendto); CPU per RECEIVED
# datagram: the receiving game loop's thread time around update + recv
# (recv, tag check, open). The anchor is the clear group in the same run:
# ratio sealed/clear per adjacent pair, min/median/max over pairs (goal
# <= 1.3x). Each repetition checks that the receiver got every datagram and
# dropped no sealed one (else the run fails). Writes bench/results/sealed.csv
# (every repetition) and sealed_summary.csv.
#
# Reflector (fanout-bench, its method: ns of CPU per copy at saturation of
# one measured CPU that carries all of the reflector's work, nothing
# subtracted): the same datagrams (equal wire bytes) to a group announced
# sealed (--data-sealed on) and to one announced clear with the instance
# flag (--data-instance on), both started once and taking turns
# (--interleave), per backend (sendto, sendmmsg, ebpf). The reflector never
# reads a sealed payload, so the ratio sealed/clear should stay within the
# repetitions' spread (max - min of each cell's repetitions, % of its
# figure, as fanout-bench reports it). A backend that cannot run gets a row
# saying why. Needs root and 2 CPUs; without root this half is skipped.
# Writes bench/results/sealed_reflector.csv.
#
# Then bench/sealed_plot.py draws sealed.png. About 3 minutes on 2 cores.
# SEALED_BENCH_ARGS / SEALED_FANOUT_ARGS add arguments to each half;
# SEALED_BACKENDS names the backends (default: sendto sendmmsg ebpf).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
client_bin="$target_dir/release/sealed-bench"
fanout_bin="$target_dir/release/fanout-bench"
for b in "$client_bin" "$fanout_bin" "$target_dir/release/reflector"; do
  if [ ! -x "$b" ]; then
    echo "sealed.sh: $b is missing: run 'make bench' (it builds the release binaries)" >&2
    exit 1
  fi
done
mkdir -p bench/results
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$client_bin" --out bench/results/sealed.csv ${SEALED_BENCH_ARGS:-}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$(id -u)" -ne 0 ]; then
  echo "sealed.sh: the reflector half needs root (namespaces, BPF programs): skipped" >&2
  echo "all,needs root (namespaces, BPF programs): not run" > "$work/unavailable.csv"
else
  for backend in ${SEALED_BACKENDS:-sendto sendmmsg ebpf}; do
    echo "=== sealed: reflector, $backend backend, clear (instance flag) vs sealed ===" >&2
    # shellcheck disable=SC2086 # word splitting of the extra arguments is intended
    if ! "$fanout_bin" --impls "$backend:instance,$backend:sealed" --interleave \
        --sizes 100,1000 --receivers 30 --repeat 4 --seconds 0.6 --delivery-seconds 0 \
        --out "$work/$backend.csv" ${SEALED_FANOUT_ARGS:-} 2> >(tee "$work/$backend.log" >&2); then
      reason=$(grep -m1 'error' "$work/$backend.log" | tr ',' ';' || true)
      echo "$backend,${reason:-fanout-bench failed (see its output)}" >> "$work/unavailable.csv"
    fi
  done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"${BENCH_PYTHON:-python3}" bench/sealed_plot.py bench/results "$work"
