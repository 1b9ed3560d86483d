#!/usr/bin/env bash
# Runs every benchmark (or the ones named: bench/run.sh reflector capture) and
# draws the plots. Each bench/<part>.sh writes bench/results/<part>*.csv; plots
# are drawn by bench/plot.py with matplotlib from a private virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_PYTHON="$(bash scripts/plot-env.sh)"
export BENCH_PYTHON
parts=("$@")
if [ ${#parts[@]} -eq 0 ]; then
  for f in bench/*.sh; do
    n=$(basename "$f" .sh); [ "$n" = run ] && continue; [[ "$n" == *_repro ]] && continue; parts+=("$n")
  done
fi
for p in "${parts[@]}"; do
  [ -f "bench/$p.sh" ] || { echo "bench: no benchmark named '$p' (have: $(ls bench/*.sh | xargs -n1 basename | sed 's/\.sh$//' | grep -v '^run$' | tr '\n' ' '))" >&2; exit 2; }
  echo "=== bench: $p ==="
  bash "bench/$p.sh"
done
