#!/usr/bin/env bash
# kvtierctl and the README's example against a real kvtierd: every command,
# --json output that parses, and exit codes for errors (1 failed operation,
# 2 bad usage, 3 no daemon).
set -u
: "${KVTIERD:=build/bin/kvtierd}" "${KVTIERCTL:=build/bin/kvtierctl}"
build=$(dirname "$(dirname "$KVTIERCTL")")
dir=$(mktemp -d /tmp/kvt-ctl-XXXXXX)
pool=/dev/shm/kvt-ctl-${dir##*-}.pool
export KVTIER_SOCKET=$dir/kvtierd.sock
fails=0
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir" "$pool"; }
trap cleanup EXIT
ok()   { if "$@" >"$dir/out" 2>"$dir/err"; then :; else echo "FAIL (rc $?): $*"; cat "$dir/err"; fails=$((fails+1)); fi; }
rc_is() { local want=$1; shift; "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
          [ $rc -eq "$want" ] || { echo "FAIL: want rc $want, got $rc: $*"; fails=$((fails+1)); }
          [ "$want" -eq 0 ] || [ "$(wc -l <"$dir/err")" -eq 1 ] ||
              { echo "FAIL: want one line on stderr: $*"; cat "$dir/err"; fails=$((fails+1)); }; }
json() { /usr/bin/python3 -c 'import json,sys; json.load(sys.stdin)' <"$dir/out" ||
         { echo "FAIL: not JSON: $*"; fails=$((fails+1)); }; }
C=$KVTIERCTL

rc_is 3 $C status                       # no daemon yet
"$KVTIERD" --socket "ipc://$KVTIER_SOCKET" --state-dir "$dir" --pool-path "$pool" \
    --pool-bytes 32M --metrics.listen 127.0.0.1:0 2>"$dir/daemon.log" &
pid=$!
for _ in $(seq 100); do $C status >/dev/null 2>&1 && break; sleep 0.1; done
ok $C status
ok $C --json status; json status
mapfile -t keys < <($C hash --scheme kvt1 --ns t/ns --chunk-tokens 4 1 2 3 4 5 6 7 8 9)
[ ${#keys[@]} -eq 2 ] || { echo "FAIL: hash gave ${#keys[@]} keys, want 2"; fails=$((fails+1)); }
head -c 100000 /dev/urandom >"$dir/a.bin"
ok $C put --ns t/ns --key "${keys[0]}" "$dir/a.bin"
ok $C put --ns t/ns --key "${keys[1]}" --parent "${keys[0]}" - <"$dir/a.bin"
ok $C get --ns t/ns --key "${keys[0]}" -o "$dir/b.bin"
cmp -s "$dir/a.bin" "$dir/b.bin" || { echo "FAIL: get returned other bytes"; fails=$((fails+1)); }
ok $C lookup --ns t/ns "${keys[@]}" --json; json lookup
grep -q '"present":2' "$dir/out" || { echo "FAIL: lookup present"; fails=$((fails+1)); }
ok $C ls --json; json ls
ok $C ls --ns t/ns
[ "$(wc -l <"$dir/out")" -eq 2 ] || { echo "FAIL: ls lines"; fails=$((fails+1)); }
ok $C stats --json; json stats
ok $C stats
ok $C delete --ns t/ns "${keys[1]}"
grep -q "deleted 1" "$dir/out" || { echo "FAIL: delete count"; fails=$((fails+1)); }
ok $C clear --ns t/ns --json; json clear
ok $C evict --bytes 1000
ok $C hash --scheme vllm --seed 0 --chunk-tokens 2 1 2 3 4 --json; json hash
ok "$build/examples/hello" "$KVTIER_SOCKET"
grep -q "2 of 2 chunks cached; first byte of chunk 1: B" "$dir/out" ||
    { echo "FAIL: example output"; cat "$dir/out"; fails=$((fails+1)); }

rc_is 1 $C get --ns t/ns --key "${keys[1]}"                  # not found
rc_is 2 $C lookup --ns t/ns nothex                            # bad key
rc_is 2 $C put --key "${keys[0]}" "$dir/a.bin"                # no --ns
rc_is 2 $C bogus                                              # unknown command
rc_is 2 $C hash --scheme vllm --chunk-tokens 2 1 2            # vllm needs --seed
rc_is 2 $C hash --scheme nope --chunk-tokens 2 1 2
rc_is 1 $C put --ns t/ns --key "${keys[0]}" /nonexistent
rc_is 1 $C put --ns "bad ns" --key "${keys[0]}" "$dir/a.bin"  # daemon refuses
rc_is 3 $C --socket "$dir/none.sock" status

kill "$pid"; wait "$pid"; rc=$?; pid=
[ $rc -eq 0 ] || { echo "FAIL: kvtierd exit $rc on SIGTERM"; fails=$((fails+1)); }
[ $fails -eq 0 ] && echo "test_ctl: all checks passed" || echo "test_ctl: $fails failed"
[ $fails -eq 0 ]
