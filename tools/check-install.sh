#!/bin/sh
# Installs cubert into a scratch prefix, then builds examples/scale_add.c
# against it twice — with pkg-config and with CMake's find_package — and
# runs both. Proves the installed library, headers and package files work.
set -eu
build=${1:-build}
prefix=$(mktemp -d /tmp/cubert-prefix.XXXXXX)
work=$(mktemp -d /tmp/cubert-consumer.XXXXXX)
trap 'rm -rf "$prefix" "$work"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(find "$prefix" -maxdepth 1 -name "lib*" -type d | head -n 1)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export LD_LIBRARY_PATH="$libdir"
export CUBERT_CACHE_DIR="$work/cache"

# shellcheck disable=SC2046 # pkg-config prints several flags
cc -std=c11 -Wall -Wextra -Werror examples/scale_add.c \
   $(pkg-config --cflags --libs cubert) -o "$work/scale_add_pc"
"$work/scale_add_pc"

mkdir -p "$work/cmake"
cat > "$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(cubert 0.1 REQUIRED)
add_executable(scale_add $(pwd)/examples/scale_add.c)
target_link_libraries(scale_add PRIVATE cubert::cubert)
CMAKE
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake/build" >/dev/null
"$work/cmake/build/scale_add"
echo "install check: pkg-config and find_package consumers ran a kernel"
