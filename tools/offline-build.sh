#!/bin/sh
# Builds and tests cubert on a machine that reaches no package registry.
# The Debian -dev packages the build needs come as .deb files in a folder
# (fetch them elsewhere with
#   apt-get download libcmocka-dev libcmocka0 libxxhash-dev libxxhash0 \
#                    libjansson-dev libjansson4
# ), unpacked into a private prefix that the build and the tests use.
#
# Usage: tools/offline-build.sh DEB_DIR [RESULTS_DIR]
# Builds into build-offline/, runs the tests, `cubert info`, `cubert demo`
# and the benchmarks, and copies their output into RESULTS_DIR when given.
set -eu
debs=${1:?usage: tools/offline-build.sh DEB_DIR [RESULTS_DIR]}
results=${2:-}
. "$(dirname "$0")/offline-env.sh"

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-offline -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUBE_BUILD_BENCH=ON >/dev/null
cmake --build build-offline -j "$jobs"

logs=$(mktemp -d /tmp/cubert-logs.XXXXXX)
# Runs a command, shows its output, keeps a copy; returns its status.
run() {
    name=$1
    shift
    rc=0
    "$@" >"$logs/$name" 2>&1 || rc=$?
    cat "$logs/$name"
    if [ -n "$results" ]; then
        mkdir -p "$results"
        cp "$logs/$name" "$results/$name"
    fi
    return $rc
}
export CUBERT_CACHE_DIR="${CUBERT_CACHE_DIR:-$prefix/cache}"
status=0
run tests.txt sh -c "cd build-offline && ctest --output-on-failure -j $jobs" ||
    status=1
run info.txt ./build-offline/cubert info || status=1
run demo.txt ./build-offline/cubert demo || status=1
run bench_cpu.txt ./build-offline/bench/bench_cpu || status=1
run bench_memory.txt ./build-offline/bench/bench_memory || status=1
exit $status
