#!/usr/bin/env bash
# The fleet lab (issue: a fleet of reflectors proven in the lab): Redis,
# reflectors, control servers and 1,000 bots over 100 client hosts in a
# netlab star under virtual time, and the events a fleet must survive
# (kill -9 of a reflector, a control server stopped, Redis restarted, a
# drain). Needs root. Writes bench/results/fleet.csv (one row per event),
# fleet_rate.csv (members and copies per second of every reflector over
# time), fleet.txt (the run's table) and fleet.png (the rate over time with
# the events marked). FLEET_ARGS adds arguments (see
# `reflector-fleet-lab --help`). FLEET_TDF sets the time dilation (default 16:
# 1,000 bots make 200,000-650,000 owed copies per virtual second as the
# events pack them on fewer reflectors; at TDF 16 a 2-core machine stayed
# 60-75 % idle and the run takes 29 minutes of wall time; a TDF 4 run lost
# half of them, but on the Fast Ethernet links of the time, which were full,
# so TDF 4 on gigabit links is untested).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/reflector-fleet-lab"
if [ ! -x "$bin" ] || [ ! -x "$target_dir/release/reflector" ]; then
  echo "fleet.sh: $bin or the reflector is missing: run 'make bench' (it builds the release binaries)" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "fleet.sh: the fleet lab needs root (network namespaces); skipped" >&2
  exit 0
fi
mkdir -p bench/results
start=$(date +%s)
set +e
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
"$bin" --tdf "${FLEET_TDF:-16}" --out bench/results ${FLEET_ARGS:-} "$@" | tee bench/results/fleet.txt
rc=${PIPESTATUS[0]}
set -e
echo "wall time: $(( $(date +%s) - start )) s" | tee -a bench/results/fleet.txt
"${BENCH_PYTHON:-python3}" bench/fleet_plot.py bench/results/fleet_rate.csv bench/results/fleet.csv bench/results/fleet.png
exit "$rc"
