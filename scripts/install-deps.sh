#!/usr/bin/env bash
# Installs the system packages the build, the tests and the benchmarks need on a
# fresh Debian machine. Idempotent: packages already present are skipped, and
# apt-get runs only when something is missing.
set -euo pipefail

# What each package is for:
#   iproute2     ip/tc: namespaces, veth, bridges, qdiscs (netlab, root tests)
#   libpcap-dev  libpcap's filter compiler (capture: tcpdump filter expressions)
#   tcpdump      anchor for capture benchmarks, and reads back our pcap files in tests
#   tshark       Wireshark's readers (tshark, capinfos): independent checks of capture's pcapng files
#   netsniff-ng  trafgen/netsniff-ng: independent traffic generator and capture anchor
#   clang, llvm  compile the eBPF programs
#   libbpf-dev   bpf_helpers.h & co., included by the eBPF programs
#   ethtool      tests turn checksum offload off on veths, so received checksums are really verified
#   pkg-config   lets the pcap crate find libpcap
#   python3      bench plots (matplotlib is installed by pip in bench/)
#   procps       ps/pgrep used by clean-up checks
#   systemd      systemd-analyze: the tests verify the shipped units in deploy/systemd
#   util-linux   setpriv: the tests run those units' commands with only their capabilities
#   libfaketime  anchor for the vtime clock-overhead benchmark (the LD_PRELOAD clock shim vtime is compared with)
#   prometheus   promtool checks /metrics and deploy/prometheus' rules; the tests run a real Prometheus scraping a reflector
#   mono-mcs     Mono's C# compiler: the client C ABI's C# binding is built with it in tests (C# 7, as Unity takes)
#   mono-runtime the mono command: runs that C# binding's example player against a real reflector in tests
#   redis-server the fleet's registry: the tests start their own Redis (registry, placement, failover)
packages=(iproute2 libpcap-dev tcpdump tshark netsniff-ng clang llvm libbpf-dev ethtool pkg-config python3 procps systemd util-linux libfaketime prometheus mono-mcs mono-runtime redis-server)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install a Rust toolchain (1.85 or newer)" >&2
  exit 1
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then rustup component add "$c"; else
      echo "install-deps: cargo $c missing and no rustup to add it" >&2; exit 1; fi
  fi
done
