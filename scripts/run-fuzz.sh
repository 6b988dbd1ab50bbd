#!/bin/sh
# Run every libFuzzer target in BUILD/fuzz for SECONDS each, on a temporary
# copy of its seed corpus and of tests/fuzz/regressions/TARGET/ (the
# committed corpus never grows), with a memory
# limit. Exit non-zero if any target finds anything; its input is kept in
# BUILD/fuzz-findings/.
#   scripts/run-fuzz.sh BUILD SECONDS [TARGET...]
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
fail=""
for t in $targets; do
    bin="$build/fuzz/$t"
    [ -x "$bin" ] || { echo "run-fuzz: $bin is not built" >&2; exit 2; }
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
        echo "fuzz $t: ${secs}s, ${runs:-?} runs, no finding"
    else
        echo "fuzz $t: FINDING (exit $rc), see $log and $findings/" >&2
        grep -m3 -E "ERROR|SUMMARY|Test unit written" "$log" >&2
        fail="$fail $t"
    fi
done
[ -z "$fail" ] || { echo "== fuzz: findings in:$fail" >&2; exit 1; }
echo "== fuzz: no findings"
