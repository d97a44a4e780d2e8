# pvio: the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
PVIO := target/release/pvio

.PHONY: all deps build demo test lint unit bench fuzz clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace --bins

## demo: build, start a host, run guests and their workloads, print what happened.
demo: build
	@scripts/demo.sh

## test: build and run every test (lints, unit, integration against the real daemons).
test: deps lint unit

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings

unit:
	$(CARGO) build --release --workspace --bins
	PVIO_BIN=$(CURDIR)/$(PVIO) $(CARGO) test --release --workspace -- --test-threads=2

bench: build
	$(PVIO) bench ring

## fuzz: run every cargo-fuzz target briefly (needs nightly and cargo-fuzz).
FUZZ_SECONDS ?= 30
fuzz:
	@for t in $$(cargo +nightly fuzz list --fuzz-dir fuzz); do \
		echo "fuzzing $$t for $(FUZZ_SECONDS)s"; \
		cargo +nightly fuzz run --fuzz-dir fuzz $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	$(CARGO) clean
