#!/bin/sh
# Installs cubert into a scratch prefix and builds programs against it, as
# README.md's "Building against cubert" tells a user to: its install and
# pkg-config recipes, taken from README.md (the shell blocks after its
# `<!-- check-install: NAME -->` lines) and run as written, with $HOME a
# scratch folder, so the prefix is $HOME/.local there, one the loader does
# not search; the program the recipe builds must start and run a kernel.
# Then the installed `cubert` program, CMake's find_package and
# add_subdirectory. Nothing here sets LD_LIBRARY_PATH.
# Usage: check-install.sh [BUILD-FOLDER] (default build), from the source
# tree; the README's `make install` builds and installs that folder.
set -eu
build=${1:-build}
src=$(pwd)
home=$(mktemp -d /tmp/cubert-home.XXXXXX)
work=$(mktemp -d /tmp/cubert-consumer.XXXXXX)
trap 'rm -rf "$home" "$work"' EXIT
unset LD_LIBRARY_PATH
export CUBERT_CACHE_DIR="$work/cache"

# The shell block that follows README.md's `<!-- check-install: $1 -->`.
readme_block() {
    awk -v mark="<!-- check-install: $1 -->" '
        $0 == mark { found = 1; next }
        found == 1 && /^```sh$/ { found = 2; next }
        found == 2 && /^```$/ { exit }
        found == 2 { print }' README.md
}

# run_recipe NAME DIR: runs README.md's block NAME in DIR with the scratch
# $HOME, stopping at the first command that fails, and says so.
run_recipe() {
    recipe=$(readme_block "$1")
    if [ -z "$recipe" ]; then
        echo "check-install: README.md has no sh block after" \
             "'<!-- check-install: $1 -->'" >&2
        exit 1
    fi
    if ! (cd "$2" && HOME=$home BUILD=$build sh -eu -c "$recipe") \
         >"$work/$1.log" 2>&1; then
        echo "check-install: README.md's $1 recipe failed, with HOME a" \
             "scratch folder:" >&2
        printf '%s\n' "$recipe" | sed 's/^/    /' >&2
        echo "  its output:" >&2
        tail -n 20 "$work/$1.log" | sed 's/^/    /' >&2
        exit 1
    fi
}

run_recipe install "$src"
prefix=$home/.local
# The recipe proves an RPATH only where the loader cannot find the
# library by itself.
if ldconfig -p 2>/dev/null | grep -q 'libcubert\.so\.0 '; then
    echo "check-install: note: libcubert.so.0 is in the loader's cache," \
         "so a program without an RPATH would start too" >&2
fi

# The README's consumer: its app.c is examples/scale_add.c.
mkdir -p "$work/app"
cp examples/scale_add.c "$work/app/app.c"
run_recipe pkg-config "$work/app"

# The program finds its library through its own RPATH.
"$prefix/bin/cubert" --version
"$prefix/bin/cubert" info >/dev/null

mkdir -p "$work/cmake"
cat > "$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(cubert 0.1 REQUIRED)
add_executable(scale_add $src/examples/scale_add.c)
target_link_libraries(scale_add PRIVATE cubert::cubert)
# As README.md says: the installed program keeps the library's folder.
set_target_properties(scale_add PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS scale_add)
CMAKE
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake/build" >/dev/null
"$work/cmake/build/scale_add"
cmake --install "$work/cmake/build" --prefix "$work/cmake/installed" >/dev/null
"$work/cmake/installed/bin/scale_add"
# Built inside another project (add_subdirectory, as FetchContent does):
# the library and program only, no tests, warnings not made errors there.
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
echo "install check: README.md's install and pkg-config recipes ran as written; the installed program ran; find_package and add_subdirectory consumers ran a kernel"
