# Entry points for humans and CI. See README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2

.PHONY: deps configure build test run demo bench install package clean

deps:
	bash deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

# ckptd in the foreground on LISTEN with its store in DATA (Ctrl-C stops it).
LISTEN ?= 127.0.0.1:50051
DATA ?= ./data
run: build
	bash deploy/run.sh $(BUILD_DIR) $(LISTEN) $(DATA)

# Offline + online walkthrough against a temporary server; files in ./sample.
demo: build
	bash deploy/run-sample.sh $(BUILD_DIR)

# Performance harness (tests/bench, docs/performance.md): always a Release build in BENCH_DIR;
# BENCH_ARGS e.g. "--size-gib 0.5". Prints a table and writes BENCH_DIR/bench-results.json.
BENCH_DIR ?= build
BENCH_ARGS ?=
bench: deps
	cmake -S . -B $(BENCH_DIR) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BENCH_DIR) -j$(JOBS) --target ckpt_bench ckptd
	$(BENCH_DIR)/tests/bench/ckpt_bench --out $(BENCH_DIR)/bench-results.json $(BENCH_ARGS)

# Installs ckptd, ckptctl, the systemd unit and the docs under PREFIX.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# A Debian package of the same files under /usr, in BUILD_DIR (ckptd_<version>_<arch>.deb).
package: build
	cd $(BUILD_DIR) && cpack -G DEB

clean:
	rm -rf $(BUILD_DIR)
