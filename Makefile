# make test  — install what is missing, then fmt check, clippy -D warnings, all tests
# make demo  — the main scenario on its embedded default
# make bench — the benchmarks; CSV + PNG under bench/results/
CARGO ?= cargo

.PHONY: deps build test lint vectors demo bench clean

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

demo: deps
	$(CARGO) build --release --workspace --bins
	bash scripts/demo.sh

bench: deps
	$(CARGO) build --release --workspace --bins
	bash bench/run.sh $(BENCH)

clean:
	$(CARGO) clean
