#!/bin/sh
# Installs the Debian packages cubert's build needs, when they are missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
# Arguments name extra packages one make target needs (clang for the
# thread-safety build; PoCL for `make bench`, the Makefile's
# BENCH_PACKAGES).
set -eu

# libclang-dev: the headers of libclang's C API, for the CPU backend's
# barrier pass (libclang itself is loaded at run time and optional).
# openmpi-bin: the CPU backend's communicators between processes load
# Open MPI at run time, and their tests run ranks with mpirun.
# zlib1g-dev: bench_memory reads the compressed allocation traces.
# pocl-opencl-icd, ocl-icd-libopencl1: an OpenCL driver for this machine's
# CPU and the ICD loader, which the OpenCL backend loads at run time; its
# conformance run needs them (without them it reports itself skipped).
# python3-*: the Python package is built against Debian's interpreter and
# its tests run there with pytest and NumPy; python3-venv makes the fresh
# environment in which the README's Python example is run after `pip
# install .`. (python3-matplotlib, for
# cubert.memviz's drawing tests, is not here: it brings ~330 MB; CI names
# it as an extra, elsewhere those two tests skip.)
PACKAGES="build-essential cmake pkg-config libcmocka-dev libxxhash-dev libjansson-dev libclang-dev zlib1g-dev pocl-opencl-icd ocl-icd-libopencl1 openmpi-bin python3-dev python3-numpy python3-pytest python3-venv $*"

# Without Debian's package tools, check what the build itself needs and
# name what is missing (package names differ between systems).
if ! command -v dpkg-query >/dev/null 2>&1; then
    need=""
    for tool in cc cmake pkg-config; do
        command -v "$tool" >/dev/null 2>&1 || need="$need $tool"
    done
    if command -v pkg-config >/dev/null 2>&1; then
        for mod in libxxhash cmocka jansson; do
            pkg-config --exists "$mod" || need="$need $mod(pkg-config)"
        done
    fi
    if [ -n "$need" ]; then
        echo "cubert: missing:$need (install them with your package manager)" >&2
        exit 1
    fi
    exit 0
fi

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "cubert: missing packages:$missing (no apt-get here; install them with your package manager)" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "cubert: missing packages:$missing" >&2
    echo "cubert: run: sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "cubert: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq $missing
