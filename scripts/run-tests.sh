#!/usr/bin/env bash
# Run every test binary under BUILD/tests, the Python tests and the shell
# tests; print one line per test and a closing "N passed, N failed, N skipped".
# Exit status 77 from a test means "skipped: this machine lacks the feature".
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
export KVTIERD=$PWD/$build/bin/kvtierd KVTIERCTL=$PWD/$build/bin/kvtierctl
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
limit=${KVT_TEST_TIMEOUT:-300}
pass=0 fail=0 skip=0 failed=()
logdir=$(mktemp -d /tmp/kvt-tests-XXXXXX)

run_one() { # name, command...
    local name=$1; shift
    local log="$logdir/$(echo "$name" | tr '/ ' '__').log" t0=$SECONDS rc
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1)); printf 'PASS %-45s %3ds\n' "$name" $((SECONDS - t0))
    elif [ $rc -eq 77 ]; then
        skip=$((skip + 1)); printf 'SKIP %-45s (%s)\n' "$name" "$(tail -n 1 "$log")"
    else
        fail=$((fail + 1)); failed+=("$name")
        printf 'FAIL %-45s rc=%d\n' "$name" $rc
        tail -n 40 "$log" | sed 's/^/    | /'
    fi
}

for t in "$build"/tests/unit/* "$build"/tests/fuzz/* "$build"/tests/integration/* \
         "$build"/tests/fault/* "$build"/tests/sim/*; do
    [ -f "$t" ] && [ -x "$t" ] && [[ "$t" != *.d ]] || continue
    run_one "${t#$build/tests/}" "$t"
done
for t in tests/integration/*.sh tests/fault/*.sh; do
    [ -f "$t" ] || continue
    run_one "$t" bash "$t"
done
if [ -z "${KVT_SAN:-}" ]; then   # Python tests drive binaries; once is enough
    for t in tests/python/test_*.py; do
        [ -f "$t" ] || continue
        run_one "$t" /usr/bin/python3 "$t"
    done
fi

echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]} (logs in $logdir)"
[ ${#failed[@]} -eq 0 ] && rm -rf "$logdir"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
