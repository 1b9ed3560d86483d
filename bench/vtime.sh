#!/usr/bin/env bash
# vtime benchmark: CPU time per clock_gettime(CLOCK_MONOTONIC) call with no
# shim (the anchor), under vtime (TDF 4, and a fractional TDF 2.5) and under
# libfaketime (FAKETIME="+0 x0.25", the same dilation), measured in the same
# run, variants interleaved, REPS repetitions each. Writes
# bench/results/vtime_clock.csv (every run), vtime_clock_summary.csv (medians,
# ratios and ns added against no shim) and vtime_clock.png.
# VTIME_BENCH_CALLS and VTIME_BENCH_REPS override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
vtime="$target_dir/release/vtime"
[ -x "$vtime" ] || cargo build --release -p vtime
faketime_so=$(dpkg -L libfaketime 2>/dev/null | grep '/libfaketime\.so\.1$' | head -1 || true)
if [ -z "$faketime_so" ] || [ ! -f "$faketime_so" ]; then
  echo "bench/vtime.sh: libfaketime not found (run scripts/install-deps.sh)" >&2
  exit 1
fi
calls=${VTIME_BENCH_CALLS:-20000000}
reps=${VTIME_BENCH_REPS:-7}
work="$target_dir/bench-vtime"
mkdir -p "$work" bench/results
probe="$work/vtime_clock"
"${CC:-cc}" -O2 -o "$probe" bench/vtime_clock.c
# One core, so the figure is not a scheduler artefact (others may be busy).
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
export VTIME_DIR="$work"

csv=bench/results/vtime_clock.csv
echo "variant,rep,calls,cpu_ns,ns_per_call" > "$csv"
run() { # variant rep cmd...
  local v=$1 r=$2; shift 2
  read -r n ns < <("$@")
  echo "$v,$r,$n,$ns,$(awk -v a="$ns" -v b="$n" 'BEGIN{printf "%.3f", a/b}')" >> "$csv"
}
for r in $(seq 1 "$reps"); do
  echo "vtime bench: repetition $r/$reps" >&2
  run none "$r" "${pin[@]}" "$probe" "$calls"
  run vtime-tdf4 "$r" "${pin[@]}" "$vtime" run --tdf 4 -- "$probe" "$calls"
  run vtime-tdf2.5 "$r" "${pin[@]}" "$vtime" run --tdf 2.5 -- "$probe" "$calls"
  run libfaketime-x0.25 "$r" env LD_PRELOAD="$faketime_so" FAKETIME="+0 x0.25" "${pin[@]}" "$probe" "$calls"
done
"${BENCH_PYTHON:-python3}" bench/vtime_plot.py bench/results
