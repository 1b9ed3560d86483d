#!/usr/bin/env bash
# The main scenario, run by `make demo` after the release build.
#
# `reflector-demo`: as root, a netlab star of client hosts around a reflector
# host, every link shaped to Fast Ethernet (100 Mb/s), control server and
# reflector on the reflector host, bots spread over the client hosts, all
# started through the lab's launcher; each fan-out backend (ebpf, sendmmsg, sendto) in turn; one
# table; non-zero exit on any loss. Not root: the same scenario on loopback,
# with a note.
#
# Extra arguments go to `reflector-demo` (see `reflector-demo --help`):
#   make demo                          # defaults
#   bash scripts/demo.sh --gigabit --clients 16
#   bash scripts/demo.sh --sealed      # sealed groups: no payload marker on the wire
# The results are also written to target/demo/demo.json and plotted to
# target/demo/demo.png when python3 with matplotlib is at hand.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${CARGO_TARGET_DIR:-$root/target}/release"
for b in reflector netlab reflector-demo; do
    if [[ ! -x "$bin/$b" ]]; then
        echo "demo.sh: $bin/$b not found: run 'cargo build --release --workspace --bins' (or 'make demo')" >&2
        exit 2
    fi
done
out="$root/target/demo"
mkdir -p "$out"
status=0
"$bin/reflector-demo" --json "$out/demo.json" "$@" || status=$?
if [[ -s "$out/demo.json" ]]; then
    if py="$(bash "$root/scripts/plot-env.sh")"; then
        "$py" "$root/scripts/demo_plot.py" "$out/demo.json" "$out/demo.png" && echo "plot: $out/demo.png"
    else
        echo "demo.sh: no python with matplotlib could be set up: skipped the plot" >&2
    fi
fi
exit "$status"
