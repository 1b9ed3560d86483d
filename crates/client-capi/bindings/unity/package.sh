#!/usr/bin/env bash
# Lays out a Unity plugin folder for the reflector client: drop the folder
# into a project's Assets/.
#
#   package.sh [OUT]      (default: target/unity/ReflectorClient under the repository)
#
#   OUT/Plugins/x86_64/libreflector_c.so   the C ABI, Linux x86_64 (release build)
#   OUT/Scripts/ReflectorClient.cs         the P/Invoke binding (library name: Native.Lib)
#   OUT/Scripts/Examples~/Player.cs        a console example (folders ending in ~ are not imported)
#   OUT/Scripts/Examples~/Mover.cs         a console example with an area of interest, moving
#   OUT/README.txt
#
# REFLECTOR_C_LIB=path/to/libreflector_c.so uses a library already built
# instead of running `cargo build --release`.
#
# Only Linux x86_64 is built and tested here. Windows (reflector_c.dll),
# macOS (libreflector_c.dylib, a bundle for the editor), Android (arm64
# .so) and iOS (a static library, with DllImport("__Internal")) are not
# built by this script: build the crate for those targets with their
# toolchains and put the library in the matching Plugins folder.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
crate="$(cd "$here/../.." && pwd)"
repo="$(cd "$crate/../.." && pwd)"
out="${1:-$repo/target/unity/ReflectorClient}"

lib="${REFLECTOR_C_LIB:-}"
if [ -z "$lib" ]; then
  (cd "$repo" && cargo build --release -p reflector-client-capi)
  lib="${CARGO_TARGET_DIR:-$repo/target}/release/libreflector_c.so"
fi
[ -f "$lib" ] || { echo "package.sh: no library at $lib" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/Plugins/x86_64" "$out/Scripts/Examples~"
cp "$lib" "$out/Plugins/x86_64/libreflector_c.so"
cp "$crate/bindings/csharp/ReflectorClient.cs" "$out/Scripts/"
cp "$crate/bindings/csharp/Player.cs" "$crate/bindings/csharp/Mover.cs" "$out/Scripts/Examples~/"
cat > "$out/README.txt" <<'TXT'
Reflector client for Unity (Linux x86_64 only).

Plugins/x86_64/libreflector_c.so  the native library; in its import settings
                                  select Standalone, Linux x86_64 (and the Editor on Linux).
Scripts/ReflectorClient.cs        namespace Reflector: Client.WithToken(...) or
                                  Client.WithControl(...), then each frame Update(),
                                  PollEvent(out ev), Recv(out d), Send(bytes); Dispose() at the end.
                                  Checkpoints: PollCheckpoint(out ck), ProvideCheckpoint(tick, state)
                                  on Requested, TakeCheckpoint(out state, out tick) on Ready.
                                  Areas (library 1.2): WithControl(..., areaRadius: 1,
                                  fallbackUrls: ...), SetPosition(x, y) on crossing into another
                                  cell, EventKind.Moved / LeftGroup.

Use a Client from the main thread (or one thread at a time). No callbacks
cross into C#, so IL2CPP needs no special attributes. Other platforms are
not built by this package: see the crate's README.
TXT
echo "package.sh: Unity plugin folder in $out"
