#!/bin/sh
# The `cubert` program's argument parsing: exit status, stream and message
# for each case; each command's own help; usage errors as one line that
# says where the help is; why `info` finds a backend unavailable.
# Usage: cli.sh PATH-TO-CUBERT
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

# usage CMD TEXT -- ARGS...: runs cubert ARGS and checks a usage error:
# status 2, nothing on stdout, one line on stderr holding TEXT and ending
# with where CMD's help is ("" for the program's).
usage() {
    cmd=$1 text=$2
    shift 3
    hint="; see 'cubert${cmd:+ $cmd} --help'"
    "$B" "$@" >"$out" 2>"$err"
    got=$?
    if [ "$got" -ne 2 ] || [ -s "$out" ] || [ "$(wc -l <"$err")" -ne 1 ] ||
       ! grep -qF -- "$text" "$err" || [ "$(tail -c $((${#hint} + 1)) "$err")" != "$hint" ]; then
        echo "FAIL: cubert $*: status $got (want 2), want one line" \
             "with '$text' ending '$hint'; stdout $(wc -l <"$out") line(s)," \
             "stderr:" >&2
        sed 's/^/    /' "$err" | head -5 >&2
        fail=1
    fi
}

# help_of CMD WORD... -- ARGS...: runs cubert ARGS and checks that it
# printed CMD's own help (status 0, stdout only): its usage line first,
# each WORD (its options), and not the program's list of commands.
help_of() {
    cmd=$1
    shift
    words=""
    while [ "$1" != -- ]; do words="$words $1"; shift; done
    shift
    "$B" "$@" >"$out" 2>"$err"
    got=$?
    ok=1
    [ "$got" -eq 0 ] && [ ! -s "$err" ] || ok=0
    head -n 1 "$out" | grep -q "^usage: cubert $cmd " || ok=0
    ! grep -q "^commands:" "$out" || ok=0
    for w in $words; do grep -qF -- "$w" "$out" || ok=0; done
    if [ $ok -eq 0 ]; then
        echo "FAIL: cubert $*: status $got, want $cmd's help with$words:" >&2
        sed 's/^/    /' "$out" | head -5 >&2
        fail=1
    fi
}

expect 0 out "cubert "             -- --version
expect 0 out "cubert "             -- version
expect 0 out "usage: cubert <command>" -- --help
expect 0 out "usage: cubert <command>" -- -h
expect 0 out "usage: cubert <command>" -- help
# The program's help lists every command and says where each one's is.
for cmd in info demo memory allreduce; do
    expect 0 out "  $cmd " -- --help
done
expect 0 out "'cubert COMMAND --help'" -- --help
usage "" "cubert: no command given (commands: info, demo, memory, allreduce)" --
usage "" "cubert: unknown command 'bogus' (commands: info, demo" -- bogus
usage "" "cubert: unknown option '--bogus'" -- --bogus
usage "" "cubert: unknown option '-x'" -- -x
usage "" "cubert: --version takes no value" -- --version=1
usage "" "cubert: version takes no argument, not 'x'" -- version x
usage "" "cubert: unknown command 'bogus'" -- help bogus
usage "" "cubert: help takes one command, not 'x'" -- help demo x

# Each command's help is its own: usage line, options, not the list.
help_of info --json -- info --help
help_of demo --device --size 2048 -- demo --help
help_of memory --device --json --demo --buffers -- memory -h
help_of allreduce --backend --ranks --max 1024 -- allreduce --help
help_of demo --device --size -- help demo
help_of allreduce --backend -- allreduce --max 4096 --help
for cmd in info demo memory allreduce; do
    help_of "$cmd" -- "$cmd" --help
    help_of "$cmd" -- "$cmd" -h
    help_of "$cmd" -- help "$cmd"
    usage "$cmd" "cubert $cmd: unknown option '--bogus'" -- "$cmd" --bogus
    usage "$cmd" "cubert $cmd: unknown option '-q'" -- "$cmd" -q
    usage "$cmd" "cubert $cmd: unexpected argument 'extra'" -- "$cmd" extra
done
usage demo "cubert demo: unknown option '--foo'" -- demo --foo
usage memory "cubert memory: option '--d' is ambiguous (--device, --demo)" \
    -- memory --d cpu

# Options with values: missing, bad, `--opt value` and `--opt=value`.
usage demo "cubert demo: --size needs a value" -- demo --size
usage demo "cubert demo: --device needs a value" -- demo --device
usage demo "--size 'abc' is not a number in 1..2048" -- demo --size abc
usage demo "--size '0' is not a number" -- demo --size=0
usage memory "cubert memory: --device needs a value" -- memory --device
usage allreduce "cubert allreduce: --max needs a value" -- allreduce --max
usage allreduce "cubert allreduce: --backend needs a value" -- allreduce --backend
usage allreduce "bad value '12' for --max (a whole number of bytes, at least 1024)" \
    -- allreduce --max 12
usage allreduce "bad value '-1' for --ranks" -- allreduce --ranks=-1
usage info "cubert info: --json takes no value" -- info --json=yes
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
usage memory "cubert memory: --buffers takes no value" -- memory --buffers=1
# A unique prefix of a long option is that option.
expect 0 out '"usage"' -- memory --dev cpu --js
expect 1 err "cube_client_open failed" -- memory --device=nosuchbackend
expect 0 out "PASS" -- demo --device cpu --size=16
expect 0 out "PASS" -- demo --size 16 --device=cpu
# Why a backend is unavailable, in the library's words, not its code's
# name: CUDA made unavailable by a driver that does not exist (or left out
# of this build).
nodriver=/nonexistent/libcuda-for-cli-test.so
CUBERT_CUDA_LIBRARY=$nodriver "$B" info >"$out" 2>"$err"
reason=$(sed -n '/^\[cuda\]/{n;p;}' "$out")
if grep -q '^backends compiled in:.* cuda' "$out"; then
    want="  unavailable: no CUDA driver: CUBERT_CUDA_LIBRARY: cannot load '$nodriver'"
else
    want="  unavailable: the cuda backend is not part of this build of cubert"
fi
case $reason in
"$want"*) ;;
*) echo "FAIL: cubert info: the line after [cuda] is '$reason', want '$want...'" >&2
   fail=1 ;;
esac
# No unavailable line anywhere only repeats the word or names the call.
if grep -E '^ *unavailable( \([a-z ]+\))?: *(\[|cube_|$)' "$out" >&2; then
    echo "FAIL: cubert info: an unavailable line without its reason (above)" >&2
    fail=1
fi
CUBERT_CUDA_LIBRARY=$nodriver "$B" info --json >"$out" 2>"$err"
if grep -q '"reason":"cube_' "$out" ||
   { grep -q '"backends":\[[^]]*"cuda"' "$out" &&
     ! grep -qF "\"reason\":\"no CUDA driver: CUBERT_CUDA_LIBRARY: cannot load '$nodriver'" "$out"; }; then
    echo "FAIL: cubert info --json: cuda's reason is not the library's" >&2
    fail=1
fi
exit $fail
