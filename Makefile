# Entry points for humans and CI. See README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2

.PHONY: deps configure build test run demo bench install package clean fuzz

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

# libFuzzer campaign (tests/fuzz): a clang build with AddressSanitizer and UBSan in FUZZ_DIR of
# the fuzz targets and what they link only; seed corpora from `ckptctl sample` (the main build's
# ckptctl) and the MindSpore fixtures when present; each target runs FUZZ_SECONDS. Fails if any
# target crashes; crash inputs are left in FUZZ_DIR/artifacts.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SANITIZE := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
# clang does not know GCC's -Wno-restrict (ckpt_target_options).
FUZZ_CXXFLAGS := $(FUZZ_SANITIZE) -Wno-unknown-warning-option
fuzz: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target ckptctl
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_FUZZ=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  "-DCMAKE_CXX_FLAGS=$(FUZZ_CXXFLAGS)" "-DCMAKE_C_FLAGS=$(FUZZ_SANITIZE)"
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target ckpt_fuzzers
	bash tests/fuzz/run.sh $(FUZZ_DIR) $(BUILD_DIR)/client/ckptctl $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD_DIR)
