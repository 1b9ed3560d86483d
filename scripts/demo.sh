#!/usr/bin/env bash
# The main scenario, run by `make demo` after the release build: for now the
# reflector's loopback demo (control server, reflector and bots as child
# processes on 127.0.0.1, once per backend), with its defaults. Extra
# arguments go to `reflector demo` (see `reflector demo --help`).
# Exits non-zero on any loss.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${CARGO_TARGET_DIR:-$root/target}/release/reflector"
if [[ ! -x "$bin" ]]; then
    echo "demo.sh: $bin not found: run 'cargo build --release --workspace --bins' (or 'make demo')" >&2
    exit 2
fi
exec "$bin" demo "$@"
