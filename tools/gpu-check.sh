#!/bin/sh
# Builds cubert on a CUDA machine without a package registry, runs the whole
# test suite (CPU and CUDA), the CUDA conformance suite under
# compute-sanitizer (memcheck and racecheck), the CUDA demo and the CUDA
# benchmarks, and keeps every output in RESULTS_DIR.
#
# Usage: tools/gpu-check.sh DEB_DIR RESULTS_DIR [STEPS]
# DEB_DIR holds the -dev packages as .deb files (see offline-build.sh).
# STEPS (default "tests sanitize demo bench") picks what runs after the
# build; "build" alone only builds; "opencl" runs the conformance suite,
# the demo and bench_opencl through NVIDIA's and PoCL's OpenCL; "comm" runs the communication
# benchmarks (a data-parallel training step beside PyTorch DDP among
# them), "asan" the fuzz corpus and conformance suite under ASan,
# "python" the Python package's tests and benchmarks (WHEEL_DIR: a folder
# with a cubert wheel to test instead of this build's extension), "multi"
# the tests and benchmarks that need two GPUs or more, "vmm" expandable
# pools on the GPU (bench_vmm: map/unmap, pool hits and the committed
# traces replayed through both presets with work queued) and the PyTorch
# allocation traces (recorded into RESULTS_DIR/traces only when
# CUBERT_RECORD_TRACES=1, else the committed ones are used; replayed
# through cubert's presets and PyTorch's allocator with and without
# expandable segments; a few minutes).
# CUBERT_SANITIZE_FILTER narrows the sanitizer runs to the tests whose
# names match it (a cmocka test filter, '*' wildcards).
set -u
debs=${1:?usage: tools/gpu-check.sh DEB_DIR RESULTS_DIR [STEPS]}
results=${2:?usage: tools/gpu-check.sh DEB_DIR RESULTS_DIR [STEPS]}
steps=${3:-tests sanitize demo bench}
. "$(dirname "$0")/offline-env.sh"
mkdir -p "$results"
jobs=$(nproc 2>/dev/null || echo 2)
export CUBERT_CACHE_DIR="$PWD/build-gpu/test-cache"

# The interpreter on PATH (the one with PyTorch and CuPy) builds and
# tests the Python package.
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null &&
    cmake --build build-gpu -j "$jobs" >"$results/build.txt" 2>&1
rc=$?
tail -n 5 "$results/build.txt"
[ $rc -eq 0 ] || exit $rc

status=0
# Runs a command with a time limit, keeps its output; notes a failure.
step() {
    name=$1
    limit=$2
    shift 2
    echo "== $name: $*"
    start=$(date +%s)
    timeout "$limit" "$@" >"$results/$name.txt" 2>&1
    code=$?
    echo "   exit $code after $(($(date +%s) - start)) s"
    tail -n 15 "$results/$name.txt"
    [ $code -eq 0 ] || status=1
}

for s in $steps; do
    case $s in
    tests)
        step tests 900 sh -c "cd build-gpu && ctest --output-on-failure -j 4"
        ;;
    sanitize)
        filter=${CUBERT_SANITIZE_FILTER:-}
        # API errors are left out: the suite provokes some on purpose (a
        # kernel name missing from its source). So is the device-fault
        # scenario's child process, whose kernel traps on purpose.
        step memcheck 900 env CONF_FILTER="$filter" compute-sanitizer \
            --tool memcheck --report-api-errors no \
            --target-processes application-only --error-exitcode 3 \
            build-gpu/tests/conformance cuda
        step racecheck 900 env CONF_FILTER="${filter:-kernel_*}" \
            compute-sanitizer --tool racecheck --error-exitcode 3 \
            build-gpu/tests/conformance cuda
        ;;
    demo)
        step demo 300 build-gpu/cubert demo --device cuda
        ;;
    bench)
        step bench_cuda 600 build-gpu/bench/bench_cuda \
            --json "$results/bench_cuda.json"
        step peers 300 python3 bench/gpu/peers_torch_cupy.py \
            --json "$results/peers.json"
        ;;
    opencl)
        # The conformance suite and the demo through each OpenCL platform
        # (NVIDIA's driver on the GPU, PoCL on the host's cores), and
        # bench_opencl beside raw OpenCL calls on each (and beside the
        # CUDA backend on the GPU).
        for platform in nvidia pocl; do
            step "conformance_opencl_$platform" 900 env \
                CUBERT_OPENCL_PLATFORM=$platform \
                build-gpu/tests/conformance opencl
            step "demo_opencl_$platform" 300 env \
                CUBERT_OPENCL_PLATFORM=$platform \
                build-gpu/cubert demo --device opencl
            step "bench_opencl_$platform" 300 env \
                CUBERT_OPENCL_PLATFORM=$platform POCL_KERNEL_CACHE=0 \
                build-gpu/bench/bench_opencl
        done
        ;;
    comm)
        # Collectives and peer copies: cubert beside raw NCCL and the
        # driver (one GPU: one rank), and between CPU devices.
        step bench_comm_cuda 300 build-gpu/bench/bench_comm_cuda \
            --json "$results/bench_comm_cuda.json"
        step bench_comm_cpu 300 build-gpu/bench/bench_comm 64
        step peers_dist 300 python3 bench/gpu/peers_torch_dist.py \
            --json "$results/peers_dist.json" \
            --cubert-json "$results/bench_comm_cuda.json"
        # A data-parallel MLP training step on one rank: checked against
        # the host reference, then timed eager and replayed beside PyTorch
        # DDP on the same GPU.
        step ddp_mlp_check 300 build-gpu/bench/bench_ddp_mlp --backend cuda \
            --ranks 1 --steps 3 --warmup 2 --check
        step ddp_mlp 300 build-gpu/bench/bench_ddp_mlp --backend cuda \
            --ranks 1 --json "$results/ddp_mlp.json"
        step peers_ddp 300 python3 bench/gpu/peers_torch_ddp.py --gpus 1 \
            --json "$results/peers_ddp.json" \
            --cubert-json "$results/ddp_mlp.json"
        ;;
    interop)
        # PyTorch memory and cubert buffers shared with nothing copied.
        step interop_torch 300 python3 bench/gpu/interop_torch_check.py \
            "$PWD/build-gpu/libcubert.so"
        ;;
    multi)
        # Two GPUs or more: the communication tests with a rank per GPU,
        # copies between GPUs with peer access on and forced off, two
        # processes with one GPU each, and the benchmarks across GPUs
        # beside raw NCCL, cuMemcpyPeerAsync and torch.distributed.
        step conformance_comm_gpus 600 env CONF_FILTER="comm_*" \
            build-gpu/tests/conformance cuda
        step conformance_copy_no_peer_access 300 env \
            CONF_FILTER="comm_copy_peer*" CUBERT_CUDA_PEER_ACCESS=0 \
            build-gpu/tests/conformance cuda
        step comm_two_processes 300 sh -c \
            "cd build-gpu && ctest --output-on-failure -R comm.cuda.2proc"
        step bench_comm_multi 400 build-gpu/bench/bench_comm_multi \
            --json "$results/bench_comm_multi.json"
        step peers_dist_gpus 300 python3 bench/gpu/peers_torch_dist.py \
            --json "$results/peers_dist_gpus.json" \
            --cubert-json "$results/bench_comm_multi.json"
        # The data-parallel MLP step with a rank per GPU, checked, then
        # timed beside PyTorch DDP over the same GPUs.
        step ddp_mlp_gpus_check 300 build-gpu/bench/bench_ddp_mlp \
            --backend cuda --steps 3 --warmup 2 --check
        step ddp_mlp_gpus 300 build-gpu/bench/bench_ddp_mlp --backend cuda \
            --json "$results/ddp_mlp_gpus.json"
        step peers_ddp_gpus 300 python3 bench/gpu/peers_torch_ddp.py \
            --json "$results/peers_ddp_gpus.json" \
            --cubert-json "$results/ddp_mlp_gpus.json"
        ;;
    python)
        # The Python package from a wheel built elsewhere (WHEEL_DIR, by
        # `pip wheel . -w DIR` on any Linux machine: one stable-ABI wheel
        # for every CPython from 3.10), else from this build: its tests
        # (PyTorch and CuPy interop on the GPU included) and the Python
        # benchmarks beside CuPy, PyTorch and NumPy.
        pypath="$PWD/build-gpu/python"
        if ls "${WHEEL_DIR:-/nonexistent}"/cubert-*.whl >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-compile \
                --target "$PWD/build-gpu/wheel-site" \
                "$WHEEL_DIR"/cubert-*.whl || status=1
            pypath="$PWD/build-gpu/wheel-site"
        fi
        step pytest 600 env PYTHONPATH="$pypath" python3 -m pytest -q \
            -p no:cacheprovider python/tests
        step bench_python_cuda 300 env PYTHONPATH="$pypath" python3 \
            bench/python/bench_python.py --device cuda \
            --json "$results/bench_python_cuda.json"
        step bench_python_cpu 300 env PYTHONPATH="$pypath" python3 \
            bench/python/bench_python.py --device cpu \
            --json "$results/bench_python_cpu.json"
        ;;
    asan)
        # The fuzz corpus and the conformance suite on CUDA under ASan and
        # UBSan (protect_shadow_gap=0 lets ASan share the address space
        # with the CUDA driver).
        cmake -S . -B build-gpu-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            "-DCUBE_SANITIZE=address;undefined" >/dev/null &&
            cmake --build build-gpu-asan -j "$jobs" \
                --target fuzz_api_replay conformance \
                >"$results/build-asan.txt" 2>&1 || status=1
        step fuzz_replay_cuda_asan 600 env CUBERT_FUZZ_BACKEND=cuda \
            ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 \
            LSAN_OPTIONS="suppressions=$PWD/tools/lsan-nccl.supp" \
            build-gpu-asan/tests/fuzz_api_replay tests/fuzz/corpus
        step conformance_cuda_asan 600 env \
            ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 \
            LSAN_OPTIONS="suppressions=$PWD/tools/lsan-nccl.supp" \
            build-gpu-asan/tests/conformance cuda
        ;;
    vmm)
        # Expandable pools over CUDA virtual memory: the memory tests
        # (the expandable preset's among them) under memcheck, the graph
        # tests (captures beside frees), bench_vmm, then the PyTorch
        # traces replayed through cubert's presets and through PyTorch's
        # allocator. About 4 minutes on an H200 (plus 4 when recording).
        step conformance_vmm_memcheck 180 env CONF_FILTER="memory_*" \
            compute-sanitizer --tool memcheck --report-api-errors no \
            --target-processes application-only --error-exitcode 3 \
            build-gpu/tests/conformance cuda
        step conformance_vmm_graphs 60 env CONF_FILTER="graph_*" \
            build-gpu/tests/conformance cuda
        # The traces are committed (bench/traces/torch_*.trace.gz);
        # CUBERT_RECORD_TRACES=1 records them afresh (about 4 minutes).
        tdir=bench/traces
        if [ "${CUBERT_RECORD_TRACES:-0}" = 1 ]; then
            tdir="$results/traces"
            mkdir -p "$tdir"
            step record_torch_traces 240 env PYTHONUNBUFFERED=1 python3 \
                tools/record-torch-trace.py --out-dir "$tdir"
        fi
        # Plain copies, so a build without zlib reads them too.
        mkdir -p "$results/plain"
        for f in "$tdir"/torch_*.trace.gz; do
            [ -f "$f" ] && gzip -dc "$f" >"$results/plain/$(basename "${f%.gz}")"
        done
        # The expandable pool beside the driver's virtual-memory calls and
        # cuMemAllocAsync, and the committed traces replayed with work
        # queued: whole-buffer writes, then a tiny kernel every 8th
        # allocation (docs/BENCHMARKS.md, "Expandable pool on CUDA").
        step bench_vmm 240 build-gpu/bench/bench_vmm "$results"/plain/*.trace
        step bench_vmm_touch 120 build-gpu/bench/bench_vmm --phases trace \
            --touch --every 8 "$results"/plain/*.trace
        step bench_memory_traces 60 build-gpu/bench/bench_memory \
            --fragmentation bench/traces/training_step.trace \
            "$results"/plain/*.trace
        step torch_replay_traces 180 env PYTHONUNBUFFERED=1 python3 \
            bench/gpu/torch_replay_trace.py \
            --json "$results/torch_replay.json" \
            bench/traces/training_step.trace "$tdir"/torch_*.trace.gz
        rm -rf "$results/plain"
        ;;
    build) ;;
    *) echo "unknown step $s"; status=1 ;;
    esac
done
exit $status
