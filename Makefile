# make test  — install what is missing, then fmt check, clippy -D warnings, all tests, every README and --help example
# make demo  — the main scenario on its embedded default
# make bench — the benchmarks; CSV + PNG under bench/results/
# make install — every binary of the workspace into $(DESTDIR)$(PREFIX)/bin (default /usr/local/bin), the
#                client library's C ABI (libreflector_c.so, .a) into .../lib and its header into .../include
CARGO ?= cargo
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include

.PHONY: deps build test lint vectors demo bench install uninstall clean

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets

# Fuzz crates are workspaces of their own (cargo fuzz builds them with a
# nightly toolchain); lint formats and type-checks them on stable, so a parser
# change cannot silently break its fuzz target. One target dir for all of them.
FUZZ_CRATES := $(wildcard crates/*/fuzz/Cargo.toml)

lint: deps
	$(CARGO) fmt --all -- --check
	@# rustfmt does not follow the `mod` items a macro declares (the fan-out, receive and
	@# capture registries declare their backends' modules), so their files are named here.
	rustfmt --edition 2021 --check crates/server/src/backend/*.rs crates/server/src/receive/*.rs \
		crates/capture/src/source/*.rs
	@for m in $(FUZZ_CRATES); do \
		echo "fuzz crate $$m: fmt, check"; \
		$(CARGO) fmt --manifest-path $$m -- --check && \
		$(CARGO) check --quiet --manifest-path $$m --target-dir target/fuzz --bins || exit 1; \
	done
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The protocol's test vectors are checked by the Rust tests (crates/proto/tests/vectors.rs)
# and, independently, by a checker written from docs/protocol.md alone.
vectors:
	python3 scripts/check-vectors.py docs/protocol-vectors.json
	python3 scripts/test_check_vectors.py

test: lint vectors
	$(CARGO) test --workspace
	python3 scripts/run-examples.py --bin-dir "$${CARGO_TARGET_DIR:-target}/debug"

demo: deps
	$(CARGO) build --release --workspace --bins
	bash scripts/demo.sh

bench: deps
	$(CARGO) build --release --workspace --bins
	bash bench/run.sh $(BENCH)

# The workspace's binaries, from cargo's own metadata (a new binary is
# installed without editing this file); the one release build is reused.
WORKSPACE_BINS = $(CARGO) metadata --no-deps --format-version 1 | python3 -c 'import json, sys; \
	print(" ".join(sorted({t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "bin" in t["kind"]})))'

install:
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release -p reflector-client-capi --lib
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)"
	@for b in $$($(WORKSPACE_BINS)); do \
		install -m 0755 "$${CARGO_TARGET_DIR:-target}/release/$$b" "$(DESTDIR)$(BINDIR)/$$b" || exit 1; \
		echo "installed $(DESTDIR)$(BINDIR)/$$b"; \
	done
	@for l in libreflector_c.so libreflector_c.a; do \
		install -m 0644 "$${CARGO_TARGET_DIR:-target}/release/$$l" "$(DESTDIR)$(LIBDIR)/$$l" || exit 1; \
		echo "installed $(DESTDIR)$(LIBDIR)/$$l"; \
	done
	install -m 0644 crates/client-capi/include/reflector_client.h "$(DESTDIR)$(INCLUDEDIR)/reflector_client.h"
	@echo "installed $(DESTDIR)$(INCLUDEDIR)/reflector_client.h"

uninstall:
	@for b in $$($(WORKSPACE_BINS)); do rm -fv "$(DESTDIR)$(BINDIR)/$$b"; done
	@rm -fv "$(DESTDIR)$(LIBDIR)/libreflector_c.so" "$(DESTDIR)$(LIBDIR)/libreflector_c.a" "$(DESTDIR)$(INCLUDEDIR)/reflector_client.h"

clean:
	$(CARGO) clean
