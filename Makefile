# make test  — install what is missing, then fmt check, clippy -D warnings, all tests
# make demo  — the main scenario on its embedded default
# make bench — the benchmarks; CSV + PNG under bench/results/
CARGO ?= cargo

.PHONY: deps build test lint demo bench clean

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: lint
	$(CARGO) test --workspace

demo: deps
	$(CARGO) build --release --workspace --bins
	bash scripts/demo.sh

bench: deps
	$(CARGO) build --release --workspace --bins
	bash bench/run.sh $(BENCH)

clean:
	$(CARGO) clean
