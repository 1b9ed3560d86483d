#!/usr/bin/env bash
# The reflector's cost per DATA datagram, by stage, from instruction counts
# (valgrind --tool=callgrind), and its syscalls per datagram (strace -c):
# deterministic figures that a busy machine does not blur, unlike CPU time.
#
# Method: reflector-bench drives the release reflector (one sender, R
# receivers on 127.0.0.1, real tokens and JOINs, at most --window datagrams
# in flight) with the reflector started under callgrind (then under strace).
# Each cell runs twice, with N and with 2N measured datagrams and the same
# warm-up, and every figure is (count at 2N - count at N) / N: start-up, the
# JOINs and shut-down cancel out, what is left is the cost of one more DATA
# datagram (its receive, membership decision, tag check and fan-out to the R
# receivers). Stages are inclusive instruction counts of the functions that
# do them (bench/reflector_stages.py names them), not timers in the hot
# path; user space only: the kernel's work shows as syscalls per datagram.
#
# Usage: bench/reflector_stages.sh [--bin-dir DIR] [--datagrams N] [--receivers 3,90]
#          [--size 100] [--impls sendmmsg] [--out FILE] [--no-strace] [--keep DIR] [--label NAME]
# --bin-dir: where reflector and reflector-bench are (default target/release);
# an older build may be measured the same way (its own bench drives it).
# --impls: reflector-bench implementations (sendmmsg, sendto, sendmmsg-untagged).
# --keep DIR: keep the callgrind and strace files there (callgrind_annotate reads them).
# Needs valgrind and strace; builds nothing (`make bench` builds the binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${CARGO_TARGET_DIR:-target}/release
datagrams=20000
receivers=3,90
size=100
impls=sendmmsg
out=bench/results/reflector_stages.txt
use_strace=1
keep=
label=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --datagrams) datagrams=$2; shift 2 ;;
    --receivers) receivers=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --impls) impls=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-strace) use_strace=0; shift ;;
    --keep) keep=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "reflector_stages.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in valgrind "${BENCH_PYTHON:-python3}"; do
  command -v "$tool" >/dev/null || { echo "reflector_stages.sh: $tool is missing (apt-get install valgrind python3)" >&2; exit 1; }
done
if [ "$use_strace" = 1 ] && ! command -v strace >/dev/null; then
  echo "reflector_stages.sh: strace is missing (apt-get install strace, or --no-strace)" >&2
  exit 1
fi
for b in reflector reflector-bench; do
  [ -x "$bin_dir/$b" ] || { echo "reflector_stages.sh: $bin_dir/$b is missing: run 'make bench' or pass --bin-dir" >&2; exit 1; }
done
bin_dir=$(cd "$bin_dir" && pwd)
if [ -n "$keep" ]; then
  # The raw callgrind and strace files stay there for callgrind_annotate.
  mkdir -p "$keep"
  tmp=$(cd "$keep" && pwd)
else
  tmp=$(mktemp -d /tmp/reflector-stages.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
fi

# The bench starts "the reflector" as a child and stops it with SIGTERM;
# these wrappers put a tool between. valgrind passes the signal on to its
# guest; strace would block it, so its wrapper forwards it to the tracee.
cat >"$tmp/reflector-callgrind" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file="\$STAGES_OUT" --dump-instr=no --dump-line=no -q "$bin_dir/reflector" "\$@"
EOF
cat >"$tmp/reflector-strace" <<EOF
#!/bin/bash
strace -f -c -o "\$STAGES_OUT" "$bin_dir/reflector" "\$@" &
tracer=\$!
stop() { for p in \$(pgrep -P "\$tracer"); do kill -TERM "\$p"; done; }
trap stop TERM INT
wait "\$tracer" || wait "\$tracer"
EOF
chmod +x "$tmp/reflector-callgrind" "$tmp/reflector-strace"

run() { # tool impl receivers datagrams outfile
  local tool=$1 imp=$2 r=$3 n=$4 file=$5
  STAGES_OUT=$file "$bin_dir/reflector-bench" --impls "$imp" --sizes "$size" --receivers "$r" \
    --copies $((n * r)) --repeat 1 --reflector "$tmp/reflector-$tool" --out "$tmp/bench.csv" \
    >"$tmp/bench.log" 2>&1 || {
    echo "reflector_stages.sh: reflector-bench failed ($tool, $imp, $r receivers, $n datagrams):" >&2
    tail -n 20 "$tmp/bench.log" >&2
    exit 1
  }
}

files=()
IFS=, read -r -a rs <<<"$receivers"
IFS=, read -r -a ims <<<"$impls"
for imp in "${ims[@]}"; do
  for r in "${rs[@]}"; do
    for n in "$datagrams" $((2 * datagrams)); do
      echo "reflector_stages.sh: $imp, $size B, $r receivers, $n datagrams: callgrind" >&2
      run callgrind "$imp" "$r" "$n" "$tmp/cg-$imp-$r-$n"
      if [ "$use_strace" = 1 ]; then
        echo "reflector_stages.sh: $imp, $size B, $r receivers, $n datagrams: strace" >&2
        run strace "$imp" "$r" "$n" "$tmp/st-$imp-$r-$n"
      else
        : >"$tmp/st-$imp-$r-$n"
      fi
    done
    files+=("$imp" "$r" "$tmp/cg-$imp-$r-$datagrams" "$tmp/cg-$imp-$r-$((2 * datagrams))"
      "$tmp/st-$imp-$r-$datagrams" "$tmp/st-$imp-$r-$((2 * datagrams))")
  done
done
mkdir -p "$(dirname "$out")"
[ -n "$label" ] || label=$(git -C "$bin_dir" rev-parse --short HEAD 2>/dev/null || git rev-parse --short HEAD)
"${BENCH_PYTHON:-python3}" bench/reflector_stages.py --datagrams "$datagrams" --size "$size" \
  --label "$label" "${files[@]}" | tee "$out"
echo "wrote $out" >&2
