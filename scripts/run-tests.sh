#!/bin/sh
# Run every test binary in a directory (optionally under $VALGRIND), print a
# summary, exit non-zero if any failed.
dir=$1
pass=0; fail=0; failed=""
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if ${VALGRIND:-} "$t"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $name"; fi
done
echo "== C tests: $pass passed, $fail failed${failed:+ (}${failed# }${failed:+)}"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
