#!/bin/sh
# Run every libFuzzer target in BUILD/fuzz for SECONDS each, on a temporary
# copy of its seed corpus and of tests/fuzz/regressions/TARGET/ (the
# committed corpus never grows), with a memory
# limit. Exit non-zero if any target finds anything; its input is kept in
# BUILD/fuzz-findings/.
#   scripts/run-fuzz.sh BUILD SECONDS [TARGET...]
# FUZZ_JOBS=N runs N targets at a time (default: the CPUs).
set -u
build=$1 secs=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
targets=${*:-$(ls "$root/tests/fuzz"/*.c | sed 's|.*/||; s|\.c$||')}
findings="$build/fuzz-findings"
mkdir -p "$findings" "$build/fuzz-logs"
# Per target: the largest input worth trying (bigger only slows the search).
max_len() {
    case $1 in
        image) echo 65536 ;; labels) echo 65536 ;; fuzz_serve) echo 65536 ;;
        cli_args) echo 1024 ;; *) echo 8192 ;;
    esac
}
# ASan's quarantine would count against the RSS limit without being a leak.
export ASAN_OPTIONS="quarantine_size_mb=16:malloc_context_size=10:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:${UBSAN_OPTIONS:-}"
# One target: its verdict line in $build/fuzz-logs/$t.status, 0 or 1 on
# the first line (the targets run side by side, each in a subshell).
run_one() {
    t=$1
    bin="$build/fuzz/$t"
    st="$build/fuzz-logs/$t.status"
    rm -f "$st"
    [ -x "$bin" ] || { printf '1\nrun-fuzz: %s is not built\n' "$bin" >"$st"; return; }
    corpus=$(mktemp -d)
    cp "$root/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null
    # Inputs that once found something are replayed first, every run.
    cp "$root/tests/fuzz/regressions/$t"/* "$corpus"/ 2>/dev/null
    dict=""
    [ -f "$root/tests/fuzz/$t.dict" ] && dict="-dict=$root/tests/fuzz/$t.dict"
    log="$build/fuzz-logs/$t.log"
    # close_fd_mask=3: the CLI targets print every rejected input's message;
    # libFuzzer keeps its own report (and the sanitizers') on a copy of stderr.
    "$bin" $dict -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=10 \
        -rss_limit_mb=512 -malloc_limit_mb=512 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="$findings/$t-" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rm -rf "$corpus"
    if [ $rc -eq 0 ]; then
        printf '0\nfuzz %s: %ss, %s runs, no finding\n' "$t" "$secs" "${runs:-?}" >"$st"
    else
        { printf '1\nfuzz %s: FINDING (exit %s), see %s and %s/\n' "$t" "$rc" "$log" "$findings"
          grep -m3 -E "ERROR|SUMMARY|Test unit written" "$log"; } >"$st"
    fi
}
# FUZZ_JOBS targets at a time (default: the CPUs; each target is one
# process on one core), so that CI's 20 seconds a target take half the
# wall time on two cores.
jobs=${FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)}
case $jobs in ''|*[!0-9]*|0) jobs=1 ;; esac
n=0
for t in $targets; do
    run_one "$t" &
    n=$((n + 1))
    [ "$n" -lt "$jobs" ] || { wait; n=0; }
done
wait
fail=""
for t in $targets; do
    st="$build/fuzz-logs/$t.status"
    if [ -f "$st" ] && [ "$(head -n 1 "$st")" = 0 ]; then
        tail -n +2 "$st"
    else
        [ -f "$st" ] && tail -n +2 "$st" >&2
        [ -f "$st" ] || echo "fuzz $t: no verdict" >&2
        fail="$fail $t"
    fi
done
[ -z "$fail" ] || { echo "== fuzz: findings in:$fail" >&2; exit 1; }
echo "== fuzz: no findings"
