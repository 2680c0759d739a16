#!/bin/sh
# tools/test-stages.sh, as `make test` runs it: every stage runs even after
# one fails, the summary names each stage with its result, and the exit
# status says whether all passed. A stand-in for make records the stages
# it was asked for and fails the ones named "bad-*".
set -u
runner=${1:?usage: test_stages.sh TOOLS_TEST_STAGES}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/fake-make" <<EOS
#!/bin/sh
# the last argument is the stage
for a; do stage=\$a; done
echo "\$stage" >>"$work/ran"
case \$stage in bad-*) exit 1 ;; esac
exit 0
EOS
chmod +x "$work/fake-make"
fail() { echo "FAIL: $*"; cat "$work/out"; exit 1; }

sh "$runner" "$work/fake-make EXTRA=1" first bad-second third >"$work/out" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "a failed stage left the exit status 0"
[ "$(tr '\n' ' ' <"$work/ran")" = "first bad-second third " ] ||
    fail "the stages run were: $(tr '\n' ' ' <"$work/ran")"
grep -Eq '^  first +passed +[0-9]+m[0-9]{2}s$' "$work/out" || fail "no summary line for 'first'"
grep -Eq '^  bad-second +FAILED +[0-9]+m[0-9]{2}s$' "$work/out" || fail "no FAILED line for 'bad-second'"
grep -Eq '^  third +passed ' "$work/out" || fail "no summary line for 'third'"
grep -Eq '^  all +FAILED ' "$work/out" || fail "no overall FAILED line"
grep -q '^stages: 2 passed, 1 failed$' "$work/out" || fail "no closing count"

rm -f "$work/ran"
sh "$runner" "$work/fake-make" one two >"$work/out" 2>&1 || fail "all stages passed, yet the exit status is not 0"
grep -Eq '^  all +passed ' "$work/out" || fail "no overall passed line"
grep -q '^stages: 2 passed, 0 failed$' "$work/out" || fail "no closing count"

sh "$runner" "$work/fake-make" >"$work/out" 2>&1
[ $? -eq 2 ] || fail "no stage named is not a usage error"
echo "test-stages: 3 cases passed"
