#!/bin/sh
# Installs cubert into a scratch prefix, runs the installed program from
# there, then builds examples/scale_add.c against the prefix twice — with
# pkg-config and with CMake's find_package — and runs both. Proves the
# installed library, program, headers and package files work from any
# prefix: nothing here sets LD_LIBRARY_PATH.
set -eu
build=${1:-build}
prefix=$(mktemp -d /tmp/cubert-prefix.XXXXXX)
work=$(mktemp -d /tmp/cubert-consumer.XXXXXX)
trap 'rm -rf "$prefix" "$work"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(find "$prefix" -maxdepth 1 -name "lib*" -type d | head -n 1)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export CUBERT_CACHE_DIR="$work/cache"
unset LD_LIBRARY_PATH

# The program finds its library through its own RPATH.
"$prefix/bin/cubert" --version
"$prefix/bin/cubert" info >/dev/null

# A consumer of a prefix the loader does not search records it, as any
# program linked there would (-Wl,-rpath).
# shellcheck disable=SC2046 # pkg-config prints several flags
cc -std=c11 -Wall -Wextra -Werror examples/scale_add.c \
   $(pkg-config --cflags --libs cubert) -Wl,-rpath,"$libdir" \
   -o "$work/scale_add_pc"
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
# Built inside another project (add_subdirectory, as FetchContent does):
# the library and program only, no tests, warnings not made errors there.
src=$(pwd)
mkdir -p "$work/sub"
cat > "$work/sub/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(embedding C)
add_subdirectory("$src" cubert)
if(CUBE_BUILD_TESTS OR CUBE_WERROR)
  message(FATAL_ERROR "cubert built its tests or -Werror inside another project")
endif()
add_executable(scale_add "$src/examples/scale_add.c")
target_link_libraries(scale_add PRIVATE cubert)
CMAKE
cmake -S "$work/sub" -B "$work/sub/build" >/dev/null
cmake --build "$work/sub/build" -j "$(nproc 2>/dev/null || echo 2)" \
    --target scale_add >/dev/null
"$work/sub/build/scale_add"
echo "install check: the installed program ran; pkg-config, find_package and add_subdirectory consumers ran a kernel"
