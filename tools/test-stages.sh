#!/bin/sh
# Runs each stage of `make test` (make targets named as arguments after the
# make program) whatever the stages before it did, prints how long each
# took and whether it passed, and exits non-zero when any failed: a user
# whose sanitizer stage fails still learns whether the fuzz stage passes.
#
# Usage: tools/test-stages.sh MAKE STAGE...
set -u
make_cmd=$1
shift
[ $# -gt 0 ] || { echo "usage: $0 MAKE STAGE..." >&2; exit 2; }

now() { date +%s; }
clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

summary=""
passed=0
failed=0
start=$(now)
for stage in "$@"; do
    echo "==> make $stage"
    t0=$(now)
    if $make_cmd --no-print-directory "$stage"; then
        result=passed
        passed=$((passed + 1))
    else
        result=FAILED
        failed=$((failed + 1))
    fi
    t1=$(now)
    echo "==> make $stage: $result in $(clock $((t1 - t0)))"
    summary="$summary$(printf '  %-20s %-7s %s' "$stage" "$result" "$(clock $((t1 - t0)))")
"
done
total=$(($(now) - start))

echo
echo "make test: each stage"
printf '  %-20s %-7s %s\n' stage result time
printf '%s' "$summary"
printf '  %-20s %-7s %s\n' all "$([ "$failed" -eq 0 ] && echo passed || echo FAILED)" "$(clock "$total")"
echo "stages: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
