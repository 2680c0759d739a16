#!/usr/bin/env bash
# Where does bench_cuda's graph replay (phase c) lose its time? Runs, on one
# GPU, the driver-only replay (graph_replay_driver) plain and with each
# thing bench_cuda's process holds by its graph phase, then bench_cuda
# with the graph phase alone and after each other phase, and prints one
# table of µs per node.
#
# Usage: bench/gpu/graph_bisect.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR holds bench/bench_cuda and bench/graph_replay_driver
# (cmake --build BUILD_DIR --target bench_cuda graph_replay_driver).
# OUT_DIR receives three files: table.txt (the table, also printed),
# bisect.log (every run's whole output) and, where nvidia-smi is found,
# clocks.csv (the GPU's clocks sampled every BISECT_CLOCK_MS, default 500;
# 0 samples nothing). Each run is stopped after BISECT_TIMEOUT seconds
# (default 90). BISECT_FULL=1 adds a full bench_cuda run. About 1.5 to 2
# minutes on an H200.
#
# Reading the table: wall is the figure bench_cuda reports (replays + sync
# on the host clock, median of 30 rounds, per node); device is the time
# between events around the same replays; launch is the host time of the
# cuGraphLaunch calls alone. In graph_replay_driver's rows, plain-before
# is measured before the run's extras exist and plain-after once they
# do: the pair tells whether holding them costs anything, in one process.
# In bench_cuda's rows, alternated-* are the figures of [c], *-alone each
# side replayed without the other in between.
set -u

build=${1:?usage: graph_bisect.sh BUILD_DIR OUT_DIR}
out=${2:?usage: graph_bisect.sh BUILD_DIR OUT_DIR}
drv=$build/bench/graph_replay_driver
bc=$build/bench/bench_cuda
for p in "$drv" "$bc"; do
    if [ ! -x "$p" ]; then
        echo "graph_bisect: $p is missing; build it first:" \
            "cmake --build $build --target bench_cuda graph_replay_driver" >&2
        exit 2
    fi
done
mkdir -p "$out" || exit 2
log=$out/bisect.log
table=$out/table.txt
clocks=$out/clocks.csv
limit=${BISECT_TIMEOUT:-90}
clock_ms=${BISECT_CLOCK_MS:-500}

work=$(mktemp -d /tmp/graph-bisect-XXXXXX) || exit 2
# cubert's compiled kernels, shared by the runs (not the compile phase's,
# which makes directories of its own).
export CUBERT_CACHE_DIR=$work/cache
sampler=
cleanup() {
    if [ -n "$sampler" ]; then
        kill "$sampler" 2>/dev/null
        wait "$sampler" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# Seconds since midnight, as the clock samples are read.
secs() {
    date +%H:%M:%S.%N | awk -F: '{ printf "%.3f", $1 * 3600 + $2 * 60 + $3 }'
}

# cubert's copy helpers: three quarters of the cores, at most 16, less the
# calling thread (src/backends/cuda/cuda_transfer.c).
cores=$(nproc 2>/dev/null || echo 2)
helpers=1
if [ "$cores" -gt 2 ]; then
    helpers=$((cores * 3 / 4))
fi
[ "$helpers" -gt 16 ] && helpers=16
helpers=$((helpers - 1))
[ "$helpers" -lt 1 ] && helpers=1

start_all=$(date +%s)
{
    echo "# graph_bisect $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "# host: $(uname -sr), $cores CPUs; $(git -C "$(dirname "$0")" \
        log -1 --format='commit %h' 2>/dev/null || echo 'commit unknown')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,persistence_mode,pstate,clocks.sm,clocks.max.sm,clocks.mem \
            --format=csv 2>&1 | sed 's/^/# /'
    fi
} >"$log"
if command -v nvidia-smi >/dev/null 2>&1 && [ "$clock_ms" -gt 0 ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw \
        --format=csv,noheader,nounits -lms "$clock_ms" >"$clocks" 2>&1 &
    sampler=$!
fi

rows=$work/rows
: >"$rows"

# run ID WHAT COMMAND...: runs it, keeps its output in the log, and adds
# a row to the table for each figure it prints.
run() {
    local id=$1 what=$2
    shift 2
    local o=$work/$id.out
    local s e rc
    echo "== $id: $what" >&2
    s=$(secs)
    timeout "$limit" "$@" >"$o" 2>&1
    rc=$?
    e=$(secs)
    {
        echo
        echo "=== $id: $what"
        echo "=== $* (exit $rc, $s..$e)"
        cat "$o"
    } >>"$log"
    local mhz=-
    if [ -s "$clocks" ]; then
        mhz=$(awk -F', ' -v s="$s" -v e="$e" '
            { split($1, dt, " "); split(dt[2], t, ":")
              x = t[1] * 3600 + t[2] * 60 + t[3]
              if (x >= s && x <= e && $2 + 0 > 0) { sum += $2; n++ } }
            END { if (n) printf "%.0f", sum / n; else printf "-" }' "$clocks")
    fi
    awk -v id="$id" -v what="$what" -v rc="$rc" -v mhz="$mhz" \
        -v secs="$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.1f", e - s }')" '
        function val(k,   i, kv) {
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == k) return kv[2]
            }
            return "-"
        }
        /^result / { name = $3 }
        /^ *detail / { name = $2 }
        /^ *detail process / { threads = val("threads"); next }
        /^result / || /^ *detail / {
            n++
            line[n] = sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", id,
                              rc == 0 ? what : what " [exit " rc "]", name,
                              val("wall"), val("device"), val("launch"),
                              val("partner"))
            thr[n] = val("threads")
        }
        END {
            if (threads == "") threads = "-"
            if (n == 0)
                printf "%s\t%s\t(no figure: exit %s)\t-\t-\t-\t-\t-\t%s\t%s\n",
                       id, what, rc, mhz, secs
            for (i = 1; i <= n; i++)
                printf "%s\t%s\t%s\t%s\n", line[i],
                       thr[i] != "-" ? thr[i] : threads, mhz, secs
        }' "$o" >>"$rows"
}

# --- the CUDA driver alone ---------------------------------------------------

d=("$drv" --label)
run d01 "driver: plain" "${d[@]}" d01
run d02 "driver: kernel takes bench_cuda's u32" "${d[@]}" d02 --params u32
run d03 "driver: kernel takes cubert's (int, u32)" "${d[@]}" d03 --params abi
run d04 "driver: u32 kernel in bench_cuda's module (with add3)" \
    "${d[@]}" d04 --params u32 --module with-add3
run d05 "driver: +4 streams (2 events each), +16 events" \
    "${d[@]}" d05 --streams 4 --events 16
run d06 "driver: +256 MiB pinned host memory" "${d[@]}" d06 --pinned 256
run d07 "driver: +256 MiB device memory" "${d[@]}" d07 --devmem 256
run d08 "driver: +$helpers idle threads (cubert's copy helpers)" \
    "${d[@]}" d08 --threads "$helpers"
run d09 "driver: 400k launches first (bench_cuda's launch phases)" \
    "${d[@]}" d09 --prelaunch 400000
run d10 "driver: a 2nd graph on a 2nd stream, alternating" \
    "${d[@]}" d10 --alternate
run d11 "driver: all of d04-d10 at once" \
    "${d[@]}" d11 --params u32 --module with-add3 --streams 4 --events 16 \
    --pinned 256 --devmem 256 --threads "$helpers" --prelaunch 400000 \
    --alternate
run d12 "driver: plain, CUDA_MODULE_LOADING=EAGER" \
    env CUDA_MODULE_LOADING=EAGER "${d[@]}" d12
run d13 "driver: plain again (drift)" "${d[@]}" d13

# --- bench_cuda, one phase before the graph phase ----------------------------

b=("$bc" --graph-detail)
run b01 "bench_cuda --peer-only: graph" "${b[@]}" --peer-only --phases graph
run b02 "bench_cuda: graph" "${b[@]}" --phases graph
run b03 "bench_cuda: check, graph" "${b[@]}" --phases check,graph
run b04 "bench_cuda: (check,) launch, graph" "${b[@]}" --phases launch,graph
run b05 "bench_cuda: sustained, graph" "${b[@]}" --phases sustained,graph
run b06 "bench_cuda: alloc, graph" "${b[@]}" --phases alloc,graph
run b07 "bench_cuda: pinned, graph" "${b[@]}" --phases pinned,graph
run b08 "bench_cuda: pageable, graph" "${b[@]}" --phases pageable,graph
run b09 "bench_cuda: roundtrip, graph" "${b[@]}" --phases roundtrip,graph
run b10 "bench_cuda: compile, graph" "${b[@]}" --phases compile,graph
run b11 "bench_cuda: cross, graph" "${b[@]}" --phases cross,graph
run b12 "bench_cuda: check, launch, sustained, graph (a full run's start)" \
    "${b[@]}" --phases check,launch,sustained,graph
run b13 "bench_cuda --peer-only: check, launch, sustained, graph" \
    "${b[@]}" --peer-only --phases check,launch,sustained,graph
run b14 "bench_cuda: graph, graph" "${b[@]}" --phases graph,graph
run b15 "bench_cuda: graph again (drift)" "${b[@]}" --phases graph
if [ "${BISECT_FULL:-0}" = 1 ]; then
    run b16 "bench_cuda: full run" "${b[@]}"
fi

# --- the table ------------------------------------------------------------------

{
    echo "# graph replay per node (µs): wall = replays + sync on the host" \
        "clock (bench_cuda's c), device = between events, launch = the" \
        "launch calls; partner = the other graph of an alternating run;" \
        "thr = the process's threads; MHz = mean SM clock sampled during" \
        "the run; s = seconds the run took"
    printf '%-4s %-58s %-26s %7s %7s %7s %7s %4s %5s %5s\n' id run \
        measurement wall device launch partner thr MHz s
    awk -F'\t' '{
        w = $2; if (length(w) > 58) w = substr(w, 1, 57) "~"
        printf "%-4s %-58s %-26s %7s %7s %7s %7s %4s %5s %5s\n",
               $1, w, $3, $4, $5, $6, $7, $8, $9, $10 }' "$rows"
    echo "# total $(($(date +%s) - start_all)) s; every run's output is in" \
        "$log"
} >"$table"
cat "$table"
