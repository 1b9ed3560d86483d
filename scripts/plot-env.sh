#!/usr/bin/env bash
# Prints the path of a python that has matplotlib, creating a private
# virtualenv under target/ the first time (PyPI). Used by the benchmarks and
# the demo to draw their PNGs. Exits non-zero if none can be had.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CARGO_TARGET_DIR:-$root/target}/bench-venv"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q matplotlib >&2
fi
echo "$venv/bin/python"
