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

# The growth case's plots (tests/bench/plot_growth.py, Debian's python3-matplotlib) from
# BENCH_DIR/bench-results.json into PLOTS_DIR (default docs/img, which docs/performance.md shows).
PLOTS_DIR ?= docs/img
.PHONY: bench-plots
bench-plots:
	/usr/bin/python3 tests/bench/plot_growth.py $(BENCH_DIR)/bench-results.json $(PLOTS_DIR)

# Installs ckptd, ckptctl, the systemd unit and the docs under PREFIX.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# A Debian package of the same files under /usr, in BUILD_DIR (ckptd_<version>_<arch>.deb).
package: build
	cd $(BUILD_DIR) && cpack -G DEB

# The ASan and fuzz builds use clang and its linker lld (Debian's clang and lld): clang compiles
# the instrumented code in about two thirds of GCC's time and lld links several times faster than
# the default linker, and these builds are most of CI's time. The TSan build stays on GCC: clang
# instantiates std::string's members instrumented in our binaries, where they also run for
# RocksDB's uninstrumented write-group code, and TSan then reports RocksDB's hand-off of a
# batch between writer threads with no RocksDB frame for the suppression to match.
CLANG_CMAKE := -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld \
	-DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld

# libFuzzer campaign (tests/fuzz): in FUZZ_DIR, a clang build of the fuzz targets and what they
# link only, instrumented as `make test-asan`'s (AddressSanitizer and UBSan, -O1 -g1) plus
# libFuzzer's coverage (-fsanitize=fuzzer-no-link); seed corpora from `ckptctl sample` (the main
# build's ckptctl) and the MindSpore fixtures when present; each target runs FUZZ_SECONDS. Fails
# if any target crashes; crash inputs are left in FUZZ_DIR/artifacts. JOBS targets run at once,
# each on its own core for FUZZ_SECONDS.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target ckptctl
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPT_FUZZ=ON \
	  -DCKPT_SANITIZE=address,undefined $(CLANG_CMAKE) -DCKPT_UNITY_BUILD=all \
	  -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target ckpt_fuzzers
	bash tests/fuzz/run.sh $(FUZZ_DIR) $(BUILD_DIR)/client/ckptctl $(FUZZ_SECONDS) $(JOBS)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR)

# ------------------------------------------------------------------ sanitizers
# The suite built with AddressSanitizer + UndefinedBehaviorSanitizer (ASAN_DIR) or
# ThreadSanitizer (TSAN_DIR), run under tests/sanitizers/env.sh (options and third-party
# suppressions; tests/sanitizers/README.md, which also says what CI runs and what it costs).
# ASan/UBSan builds every test binary but the load campaign and runs the suite but the labels in
# SAN_EXCLUDE: tests that only re-run the same binaries from Python, the docs, packaging, the
# benchmark smoke, the fault loop, the fuzz seed replay (`make fuzz` runs those targets under
# ASan itself) and the load campaign, which measures throughput.
# ThreadSanitizer builds and runs the multi-threaded engine and storage tests (TSAN_TARGETS,
# label "threads"): the tests driving a real ckptd are labelled "threads" too but not built here,
# because Debian's gRPC is not instrumented and TSan reports every hand-off between a reactor's
# reactions as a race (README.md).
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
SAN_EXCLUDE ?= python|docs|deploy|bench|chaos|load|fuzz
# A test binary added to the suite is added to ASAN_TARGETS too: otherwise its tests show up in
# the ASan run as <binary>_NOT_BUILT and fail it. The load campaign is left out on purpose.
ASAN_TARGETS ?= ckptd ckptctl core_test files_test store_test segment_files_test client_test \
	service_test job_test ckptctl_test fixture_compat_test server_test jobs_cli_test auth_test \
	hostile_input_test disk_full_test cli_scripting_test observability_test stall_test \
	store_maintenance_test storm_test many_tensors_test
# The load campaign's binary is not built for ASan (above), nor the upload memory test (whose
# peak RSS would count ASan's shadow memory and quarantine): their placeholder tests are skipped.
ASAN_SKIP ?= ^(load_test|upload_memory_test)_NOT_BUILT$$
TSAN_TARGETS ?= store_test segment_files_test service_test job_test
SANITIZE_ENV = tests/sanitizers/env.sh
# The sanitizer builds build their binaries through the one target ckpt_suite (CKPT_SUITE_TARGETS,
# a CMake list), so that they build side by side. The ASan build compiles every target in batches
# (CKPT_UNITY_BUILD=all); the TSan build compiles file by file, because batched, GCC instantiates
# std::string members in our binaries that RocksDB's write-group code then runs, and TSan reports
# RocksDB's hand-off of a batch between writer threads (the report clang's TSan gives, above).
empty :=
space := $(empty) $(empty)
cmake_list = $(subst $(space),;,$(strip $(1)))

.PHONY: test-asan test-tsan

test-asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPT_SANITIZE=address,undefined \
	  $(CLANG_CMAKE) -DCKPT_UNITY_BUILD=all "-DCKPT_SUITE_TARGETS=$(call cmake_list,$(ASAN_TARGETS))"
	$(SANITIZE_ENV) cmake --build $(ASAN_DIR) -j$(JOBS) --target ckpt_suite
	cd $(ASAN_DIR) && $(CURDIR)/$(SANITIZE_ENV) ctest --output-on-failure -j$(JOBS) \
	  -LE '$(SAN_EXCLUDE)' -E '$(ASAN_SKIP)'

test-tsan: deps
	cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=Release -DCKPT_SANITIZE=thread \
	  -DCKPT_UNITY_BUILD=off "-DCKPT_SUITE_TARGETS=$(call cmake_list,$(TSAN_TARGETS))"
	$(SANITIZE_ENV) cmake --build $(TSAN_DIR) -j$(JOBS) --target ckpt_suite
	cd $(TSAN_DIR) && $(CURDIR)/$(SANITIZE_ENV) ctest --output-on-failure -j$(JOBS) -L threads

# ------------------------------------------------------------------ fault loop
# ckptd killed with SIGKILL N times during random uploads, transform and export jobs and
# deletes, restarted, every committed checkpoint checked byte for byte (tests/chaos/chaos.py).
# CHAOS_ARGS e.g. "--seed 7 -v --big-mib 32".
N ?= 20
CHAOS_ARGS ?=
.PHONY: chaos
chaos: build
	python3 tests/chaos/chaos.py --ckptd $(BUILD_DIR)/service/ckptd \
	  --ckptctl $(BUILD_DIR)/client/ckptctl -n $(N) $(CHAOS_ARGS)
