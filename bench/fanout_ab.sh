#!/usr/bin/env bash
# Two reflector builds measured with one fanout-bench (the saturation method
# of the hardening issue), runs interleaved A B B A A B B A ... so that the
# host's slow stretches, which last minutes, fall on both alike; every run
# has its own raw-loop anchor.
#
# Usage: bench/fanout_ab.sh REFLECTOR_A REFLECTOR_B [--rounds N] [--dir DIR]
#          [-- fanout-bench args]
# REFLECTOR_A/B are `reflector` binaries (or wrappers that translate the
# flags fanout-bench passes for an older build). A round is A B B A, so each
# build runs 2 x N times (default N = 2). Default fanout-bench args:
#   --impls raw-loop,sendto,sendmmsg,ebpf --sizes 100,1000 --receivers 3,90
#   --repeat 3 --seconds 1.2 --interleave
# Keeps every run's CSV in DIR (default bench/results/fanout_ab) and prints
# bench/fanout_ab.py's comparison: per cell, each build's ns per copy as a
# ratio to its run's raw loop (median over its runs, lowest-highest), B over
# A, and whether B is within the tolerance of A. Needs root and a quiet
# machine; builds nothing (`make bench` first). Not part of bench/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
a=$(realpath "$1")
b=$(realpath "$2")
shift 2
rounds=2
dir=bench/results/fanout_ab
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "fanout_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--impls raw-loop,sendto,sendmmsg,ebpf --sizes 100,1000 --receivers 3,90
  --repeat 3 --seconds 1.2 --interleave)
for f in "$a" "$b"; do
  [ -x "$f" ] || { echo "fanout_ab.sh: $f is not an executable" >&2; exit 2; }
done
bin="${CARGO_TARGET_DIR:-target}/release/fanout-bench"
[ -x "$bin" ] || { echo "fanout_ab.sh: $bin is missing: run 'make bench'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "fanout_ab.sh: needs root (namespaces, BPF programs)" >&2; exit 2; }
mkdir -p "$dir"
{
  # Names and digests, not paths: the file is meant to be committed.
  echo "A = $(basename "$a") (sha256 $(sha256sum "$a" | cut -c1-16))"
  echo "B = $(basename "$b") (sha256 $(sha256sum "$b" | cut -c1-16))"
  echo "fanout-bench ${args[*]}"
  echo "order per round: A B B A; rounds: $rounds"
} > "$dir/runs.txt"
start=$(date +%s)
n=0
for round in $(seq 1 "$rounds"); do
  for side in A B B A; do
    n=$((n + 1))
    refl=$a
    [ "$side" = B ] && refl=$b
    out="$dir/$side-$n.csv"
    echo "=== fanout_ab: run $n of $((4 * rounds)) ($side), $(( $(date +%s) - start )) s so far ===" >&2
    "$bin" --reflector "$refl" --out "$out" "${args[@]}" > "$dir/$side-$n.log" 2>&1 || {
      echo "fanout_ab.sh: run $n ($side) failed; its output is in $dir/$side-$n.log" >&2
      exit 1
    }
  done
done
echo "=== fanout_ab: $n runs in $(( $(date +%s) - start )) s ===" >&2
python3 bench/fanout_ab.py --tolerance "${FANOUT_AB_TOLERANCE:-10}" "$dir"
