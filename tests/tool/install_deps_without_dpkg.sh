#!/bin/sh
# tools/install-deps.sh on a system without Debian's package tools: PATH
# holds only what the script may use (no dpkg-query, no apt-get), so it
# checks what the build needs itself and names what is missing.
# Usage: install_deps_without_dpkg.sh REPO_ROOT
set -u
root=${1:?usage: install_deps_without_dpkg.sh REPO_ROOT}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
link() {
    p=$(command -v "$1") || fail "this machine lacks $1"
    ln -s "$p" "$bin/$1"
}
for t in sh cc cmake pkg-config; do
    link "$t"
done
[ ! -e "$bin/dpkg-query" ] || fail "dpkg-query is on the test PATH"

# Everything there: success, nothing printed, no package tool run.
out=$(PATH="$bin" sh "$root/tools/install-deps.sh" 2>&1) ||
    fail "with every tool and module present: $out"
[ -z "$out" ] || fail "printed with nothing missing: $out"

# A tool missing: named, exit 1.
rm "$bin/cmake"
out=$(PATH="$bin" sh "$root/tools/install-deps.sh" 2>&1)
code=$?
[ $code -eq 1 ] || fail "cmake missing: exit $code, not 1 ($out)"
echo "$out" | grep -q "missing:.*cmake" || fail "cmake not named: $out"
link cmake

# pkg-config modules missing: each named.
out=$(PATH="$bin" PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH= \
    sh "$root/tools/install-deps.sh" 2>&1)
code=$?
[ $code -eq 1 ] || fail "modules missing: exit $code, not 1 ($out)"
for m in libxxhash cmocka jansson; do
    echo "$out" | grep -q "$m(pkg-config)" || fail "$m not named: $out"
done
echo "ok: install-deps.sh without dpkg checks tools and modules"
