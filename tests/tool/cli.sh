#!/bin/sh
# The `cubert` program's argument parsing: exit status, stream and first
# line of the message for each case. Usage: cli.sh PATH-TO-CUBERT
set -u
B=$1
fail=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# expect STATUS STREAM TEXT -- ARGS...: runs cubert ARGS, checks the exit
# status and that STREAM (out or err) holds TEXT (a fixed string).
expect() {
    want=$1 stream=$2 text=$3
    shift 4
    "$B" "$@" >"$out" 2>"$err"
    got=$?
    if [ "$stream" = out ]; then f=$out; else f=$err; fi
    if [ "$got" -ne "$want" ] || ! grep -qF -- "$text" "$f"; then
        echo "FAIL: cubert $*: status $got (want $want), std$stream:" >&2
        sed 's/^/    /' "$f" | head -5 >&2
        fail=1
    fi
}

expect 0 out "cubert "             -- --version
expect 0 out "cubert "             -- version
expect 0 out "usage: cubert"       -- --help
expect 0 out "usage: cubert"       -- -h
expect 0 out "usage: cubert"       -- help
expect 2 err "cubert: no command"  --
expect 2 err "unknown command 'bogus'" -- bogus
expect 2 err "cubert: unknown option '--bogus'" -- --bogus
expect 2 err "cubert: unknown option '-x'" -- -x
expect 2 err "--version takes no value" -- --version=1

for cmd in info demo memory allreduce; do
    expect 0 out "usage: cubert" -- $cmd --help
    expect 0 out "usage: cubert" -- $cmd -h
    expect 2 err "cubert $cmd: unknown option '--bogus'" -- $cmd --bogus
    expect 2 err "cubert $cmd: unknown option '-q'" -- $cmd -q
    expect 2 err "cubert $cmd: unexpected argument 'extra'" -- $cmd extra
done

# Options with values: missing, bad, `--opt value` and `--opt=value`.
expect 2 err "cubert demo: --size needs a value" -- demo --size
expect 2 err "cubert demo: --device needs a value" -- demo --device
expect 2 err "--size 'abc' is not a number" -- demo --size abc
expect 2 err "--size '0' is not a number" -- demo --size=0
expect 2 err "cubert memory: --device needs a value" -- memory --device
expect 2 err "cubert allreduce: --max needs a value" -- allreduce --max
expect 2 err "cubert allreduce: --backend needs a value" -- allreduce --backend
expect 2 err "bad value '12' for --max" -- allreduce --max 12
expect 2 err "bad value '-1' for --ranks" -- allreduce --ranks=-1
expect 2 err "cubert info: --json takes no value" -- info --json=yes
expect 0 out '"version"' -- info --json
expect 0 out '"usage"' -- memory --device cpu --json
expect 0 out '"usage"' -- memory --device=cpu --json
expect 0 out "cubert memory on cpu" -- memory --device=cpu
# The counters follow the report, in both forms.
expect 0 out "pool hits" -- memory --device cpu --demo
expect 0 out '{"stats":{"stream":{"allocations":' -- memory --json --demo
# The live buffers follow the counters: largest first, labelled.
expect 0 out "live buffers (cube_memory_snapshot): 0" -- memory --buffers
expect 0 out '{"buffers":[]}' -- memory --json --buffers
expect 0 out "demo 1000 bytes" -- memory --device cpu --demo --buffers
expect 0 out '{"buffers":[{"handle":"0x' -- memory --json --demo --buffers
expect 0 out ',"label":"demo 64 bytes"}]}' -- memory --json --demo --buffers
expect 2 err "cubert memory: --buffers takes no value" -- memory --buffers=1
# A unique prefix of a long option is that option.
expect 0 out '"usage"' -- memory --dev cpu --js
expect 1 err "cube_client_open failed" -- memory --device=nosuchbackend
expect 0 out "PASS" -- demo --device cpu --size=16
expect 0 out "PASS" -- demo --size 16 --device=cpu
exit $fail
