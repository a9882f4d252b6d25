# Entry points for building, running, testing and benchmarking Narad.
# `make` alone lists the targets.

CARGO ?= cargo

.DEFAULT_GOAL := help
.PHONY: help build run test prove-tests-fail bench bench-matrix report-check fio clean

help: ## List the targets.
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

build: ## Build every crate, optimised.
	$(CARGO) build --release --workspace

run: ## Run a single-node broker in development mode.
	$(CARGO) run --release -- serve --dev

# The suite usually runs on a fresh clone, where incremental compilation only
# writes caches nobody reads: a clean build without it takes a third less time.
test prove-tests-fail: export CARGO_INCREMENTAL = 0

# The proof that the tests can fail builds deliberately broken variants; it joins
# the suite as soon as its script exists.
test: ## The whole suite: format, lints, tests, and proof that the tests can fail.
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace
	@if [ -f tools/prove-tests-fail.sh ]; then \
		bash tools/prove-tests-fail.sh; \
	else \
		echo "tools/prove-tests-fail.sh is absent: skipping the broken-variant proof"; \
	fi

prove-tests-fail: ## Show that the durability tests fail against broken variants.
	bash tools/prove-tests-fail.sh

bench: ## Install benchmark tools, run the fio baseline, the cargo benchmarks and the narad bench matrix.
	tools/install-deps.sh
	benches/fio/run.sh
	python3 benches/fio/readback.py
	$(CARGO) bench
	$(MAKE) bench-matrix

bench-matrix: ## Run the narad bench matrix and update benches/RESULTS.md (MATRIX_FLAGS: see benches/matrix.py).
	$(CARGO) build --release
	python3 benches/matrix.py $(MATRIX_FLAGS)

report-check: ## Check that a narad bench --report page renders offline in headless Chromium, with its plots.
	tools/install-deps.sh
	$(CARGO) build --release
	python3 benches/report_check.py --binary target/release/narad --out target/report-check

fio: ## Run the fio baseline only (FIO_DIR, FIO_RUNTIME_S: see benches/fio/run.sh).
	benches/fio/run.sh

clean: ## Remove build outputs and the fio test file.
	$(CARGO) clean
	rm -rf target/fio
