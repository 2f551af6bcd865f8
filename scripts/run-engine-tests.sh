#!/usr/bin/env bash
# make test-engines: kvtier inside real engines (vLLM, SGLang) and the KV
# events read by vLLM's own decoder. Creates the engines' virtual
# environment (cached outside the clone, scripts/engines-env.sh) and the tiny
# test model (~/.cache/kvtier/models/tiny), then runs tests/engines/test_*.py
# with that environment's python. Fails loudly when the environment cannot
# be built: it never skips.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
py=$(scripts/engines-env.sh) || { echo "test-engines: the engines environment could not be built (see above)"; exit 1; }
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
model=${KVT_ENGINE_MODEL:-$home/.cache/kvtier/models/tiny}
"$py" tests/engines/make_model.py "$model" >/dev/null 2>&1 || { echo "test-engines: making the model failed"; exit 1; }
export KVT_ENGINE_MODEL=$model KVTIER_BUILD=$PWD/$build
export KVTIERD=$PWD/$build/bin/kvtierd KVTIERCTL=$PWD/$build/bin/kvtierctl
limit=${KVT_ENGINE_TEST_TIMEOUT:-1200}
pass=0 fail=0 failed=()
logdir=$(mktemp -d /tmp/kvt-engine-tests-XXXXXX)
for t in tests/engines/test_*.py; do
    name=${t#tests/}
    log="$logdir/$(basename "$t").log" t0=$SECONDS
    timeout -k 10 "$limit" "$py" "$t" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1)); printf 'PASS %-45s %3ds\n' "$name" $((SECONDS - t0))
    else
        fail=$((fail + 1)); failed+=("$name")
        printf 'FAIL %-45s rc=%d\n' "$name" $rc
        tail -n 60 "$log" | sed 's/^/    | /'
    fi
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]} (logs in $logdir)"
[ ${#failed[@]} -eq 0 ] && rm -rf "$logdir"
echo "engines: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ]
