#!/usr/bin/env bash
# Follows the README as a new user would, from a clean clone of this
# repository's HEAD: `make install` into a private prefix, every README and
# --help example with the installed binaries first on PATH
# (scripts/run-examples.py), then `make demo`. Needs root (the lab examples
# and the demo build namespaces) and about 20 minutes on 2 cores (a release
# build). Leaves nothing behind: the clone and the prefix are removed.
#   bash scripts/follow-readme.sh            # HEAD of this checkout
#   KEEP=1 bash scripts/follow-readme.sh     # keep the clone for a look
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d /tmp/follow-readme.XXXXXX)"
cleanup() { [ -n "${KEEP:-}" ] && echo "follow-readme: kept $work" || rm -rf "$work"; }
trap cleanup EXIT
# The shared design notes sit beside the repository; the clone gets them too.
[ -d "$src/../shared" ] && ln -s "$(cd "$src/../shared" && pwd)" "$work/shared"
echo "== clone"
git clone -q "$src" "$work/repo"
cd "$work/repo"
echo "== make install (PREFIX=$work/usr)"
make install PREFIX="$work/usr"
export PATH="$work/usr/bin:$PATH"
echo "== a C game against the installed client library and header"
cc -I"$work/usr/include" crates/client-capi/examples/c/grid.c -L"$work/usr/lib" -Wl,-rpath,"$work/usr/lib" \
    -lreflector_c -o "$work/grid"
usage="$("$work/grid" 2>&1 || true)"   # no arguments: it loads the library and prints its usage
case "$usage" in *usage:*) ;; *) echo "follow-readme: the C example linked to the installed library did not run: $usage"; exit 1 ;; esac
echo "== every README and --help example, with the installed binaries"
python3 scripts/run-examples.py --bin-dir "$work/usr/bin"
echo "== make demo"
make demo
echo "follow-readme: the README's build, install, examples and demo all ran as written"
