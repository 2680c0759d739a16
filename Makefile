# cubert — the two commands: `make demo` and `make test`.
# CMake does the building; this file installs what is missing and wraps it.

BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps build demo test test-fast test-install test-asan test-tsan test-thread-safety test-fuzz fuzz fuzz-long bench bench-deps install clean info

all: build

# Installs the Debian packages the build needs when they are missing (as
# root); otherwise prints the exact command to run.
deps:
	@./tools/install-deps.sh

$(BUILD)/build.ninja $(BUILD)/Makefile: CMakeLists.txt
	@./tools/install-deps.sh
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# The main job: a tiled matrix product, a reduction and a softmax on the
# default device (the CPU backend), each checked against plain C. Builds
# the program and the library it links, not the tests and benchmarks.
demo: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS) --target cubert_tool
	./$(BUILD)/cubert demo

info: build
	./$(BUILD)/cubert info

# Unit tests and the conformance suite, then the same under ASan+UBSan and
# under TSan, the library through clang's thread-safety analysis and the
# fuzzer. Every stage runs even when one before it failed; a summary of
# each stage's result and time ends the output, and the exit status is
# non-zero when any failed.
TEST_STAGES = test-fast test-install test-asan test-tsan test-thread-safety test-fuzz

test:
	@./tools/test-stages.sh "$(MAKE) FI_ONCE=1" $(TEST_STAGES)

# Within `make test` the plain build's fault-injection test fails each call
# site once: the ASan build fails every call, with the same checks and the
# leak check besides.
FI_ENV = $(if $(FI_ONCE),CUBE_FI_BUDGET=0)

# Installs into a scratch prefix and builds a program against it with
# pkg-config and with CMake's find_package.
test-install: build
	./tools/check-install.sh $(BUILD)

test-fast: build
	cd $(BUILD) && $(FI_ENV) ctest --output-on-failure -j $(JOBS)

# The sanitizer builds load the kernels the plain build's tests compiled
# (kernels are built by the system compiler, not with the library's flags).
TEST_CACHE_FLAG = -DCUBE_TEST_CACHE_DIR=$(abspath $(BUILD))/test-cache

test-asan:
	@./tools/install-deps.sh
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DCUBE_BUILD_BENCH=OFF \
	  "-DCUBE_SANITIZE=address;undefined" $(TEST_CACHE_FLAG) $(CMAKE_FLAGS)
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && CUBE_FI_ALL=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

# The OpenCL suite runs in the plain and ASan builds, not here: its
# device is PoCL, whose threads TSan does not instrument, so the run would
# see cubert's side only (the CPU backend's runs cover that) and costs a
# minute of `make test`'s ten.
TSAN_EXCLUDE = -E '^conformance\.opencl$$'

test-tsan:
	@./tools/install-deps.sh
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DCUBE_BUILD_BENCH=OFF \
	  -DCUBE_SANITIZE=thread $(TEST_CACHE_FLAG) $(CMAKE_FLAGS)
	cmake --build $(BUILD)-tsan -j $(JOBS)
	cd $(BUILD)-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) $(TSAN_EXCLUDE)

# The library built by clang with -Wthread-safety (as errors): locks taken
# and dropped on every path, functions that need a lock called with it,
# guarded globals used under their lock (src/base/mutex.h).
test-thread-safety:
	@./tools/install-deps.sh clang
	cmake -S . -B $(BUILD)-thread-safety -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_BUILD_TYPE=Debug -DCUBE_BUILD_TESTS=OFF -DCUBE_BUILD_BENCH=OFF \
	  -DCMAKE_C_FLAGS="-Wthread-safety -Wthread-safety-beta" $(CMAKE_FLAGS)
	cmake --build $(BUILD)-thread-safety -j $(JOBS)

# The API fuzz target (tests/fuzz/fuzz_api.c) under libFuzzer, ASan and
# UBSan, on $(FUZZ_BACKEND), starting from the committed seed corpus; new
# inputs collect in $(BUILD)-fuzz/corpus and crashes in $(BUILD)-fuzz/.
# `make fuzz` runs $(FUZZ_TIME) s, `make fuzz-long` 30 minutes, `make
# test` 45 s.
FUZZ_TIME ?= 60
FUZZ_BACKEND ?= cpu
FUZZ_RUN = mkdir -p $(BUILD)-fuzz/corpus && cd $(BUILD)-fuzz && \
	  CUBERT_FUZZ_BACKEND=$(FUZZ_BACKEND) CUBERT_CACHE_DIR=$(abspath $(BUILD)-fuzz)/cache \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ./tests/fuzz_api -print_final_stats=1 -max_len=512 -timeout=30 \
	  -artifact_prefix=$(abspath $(BUILD)-fuzz)/ \
	  -dict=$(CURDIR)/tests/fuzz/fuzz_api.dict corpus $(CURDIR)/tests/fuzz/corpus

$(BUILD)-fuzz/tests/fuzz_api: FORCE
	@./tools/install-deps.sh clang
	cmake -S . -B $(BUILD)-fuzz -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUBE_BUILD_BENCH=OFF \
	  -DCUBE_BUILD_FUZZ=ON "-DCUBE_SANITIZE=address;undefined" $(CMAKE_FLAGS)
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_api

fuzz: $(BUILD)-fuzz/tests/fuzz_api
	$(FUZZ_RUN) -max_total_time=$(FUZZ_TIME)

fuzz-long: $(BUILD)-fuzz/tests/fuzz_api
	$(FUZZ_RUN) -max_total_time=1800

test-fuzz: $(BUILD)-fuzz/tests/fuzz_api
	$(FUZZ_RUN) -max_total_time=45

.PHONY: FORCE
FORCE:

# What only `make bench` needs: PoCL's CPU device, a peer of bench_cpu's
# section (f), loaded at run time (bench_cpu skips it and says why when it
# is missing, so a failed install does not stop the bench).
BENCH_PACKAGES = pocl-opencl-icd ocl-icd-libopencl1

bench-deps:
	@./tools/install-deps.sh $(BENCH_PACKAGES) || \
	  echo "cubert: bench_cpu runs without PoCL" >&2

bench: build bench-deps
	./$(BUILD)/bench/bench_cpu
	./$(BUILD)/bench/bench_memory
	./$(BUILD)/bench/bench_threads

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-thread-safety $(BUILD)-fuzz
