#!/usr/bin/env bash
# kvtierctl's NVMe commands against a real kvtierd with an NVMe tier:
# flush (and flush --evict), verify (clean, then after bytes are flipped in
# a data file: the damage is reported, exit 1, and the record dropped),
# per-tier usage in stats and stats --json, and what an NVMe-less daemon
# says to them (exit 1, one line).
set -u
: "${KVTIERD:=build/bin/kvtierd}" "${KVTIERCTL:=build/bin/kvtierctl}"
dir=$(mktemp -d /tmp/kvt-ctlnv-XXXXXX)
pool=/dev/shm/kvt-ctlnv-${dir##*-}.pool
export KVTIER_SOCKET=$dir/kvtierd.sock
fails=0
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir" "$pool"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
ok() { "$@" >"$dir/out" 2>"$dir/err" || { fail "(rc $?) $*"; cat "$dir/err"; }; }
rc_is() { local want=$1; shift; "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
          [ $rc -eq "$want" ] || fail "want rc $want, got $rc: $*"
          [ "$want" -eq 0 ] || [ "$(wc -l <"$dir/err")" -eq 1 ] || fail "want one line on stderr: $*"; }
py() { /usr/bin/python3 -c "$1" <"$dir/out" || fail "$2"; }
C=$KVTIERCTL

start() {
    "$KVTIERD" --socket "ipc://$KVTIER_SOCKET" --state-dir "$dir" --pool-path "$pool" \
        --pool-bytes 32M --metrics.listen 127.0.0.1:0 "$@" 2>>"$dir/daemon.log" &
    pid=$!
    for _ in $(seq 100); do $C status >/dev/null 2>&1 && break; sleep 0.1; done
}
stop() { kill "$pid"; wait "$pid"; pid=; }

start --nvme.nvme_bytes 64M --nvme.file_bytes 16M --nvme.fsync 0
mapfile -t keys < <($C hash --scheme kvt1 --ns t/nv --chunk-tokens 2 1 2 3 4 5 6 7 8)
for i in 0 1 2 3; do
    head -c $((200000 + i * 1000)) /dev/urandom >"$dir/$i.bin"
    ok $C put --ns t/nv --key "${keys[$i]}" "$dir/$i.bin"
done
ok $C flush
grep -q "flushed 4 chunks" "$dir/out" || fail "flush: $(cat "$dir/out")"
ok $C --json flush --evict
py 'import json,sys; d=json.load(sys.stdin); assert d["written"]==0 and d["clean"]==4, d' "flush --evict json"
ok $C lookup --ns t/nv "${keys[@]}"
[ "$(grep -c ' nvme$' "$dir/out")" -eq 4 ] || fail "lookup after flush --evict: $(cat "$dir/out")"
ok $C --json stats
py 'import json,sys; d=json.load(sys.stdin); t=d["tiers"]
assert t["dram"]["chunks"]==0 and t["nvme"]["chunks"]==4, t
assert t["nvme"]["used"]>0 and t["nvme"]["capacity"]==64<<20, t
assert d["nvme"]["demotions"]==4 and d["nvme"]["registered_buffers"] in (True, False), d["nvme"]' "stats --json tiers"
ok $C stats
grep -q "tier nvme" "$dir/out" && grep -q "nvme errors" "$dir/out" || fail "stats text: $(cat "$dir/out")"
ok $C get --ns t/nv --key "${keys[1]}" -o "$dir/back.bin"
cmp -s "$dir/1.bin" "$dir/back.bin" || fail "get from NVMe returned other bytes"
ok $C verify
grep -q "verified 4 NVMe records" "$dir/out" || fail "verify: $(cat "$dir/out")"
# Flip a byte in every record's data behind the daemon's back.
f=$dir/nvme/kvtier-00000.nvd
/usr/bin/python3 - "$f" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
size = os.fstat(fd).st_size
for at in range(8192 + 7, size, 65536):
    b = os.pread(fd, 1, at)
    os.pwrite(fd, bytes([b[0] ^ 0xff]), at)
os.fsync(fd)
PY
rc_is 1 $C --json verify --limit 1
py 'import json,sys; d=json.load(sys.stdin); assert d["bad"]==1 and d["checked"]==1, d' "verify --limit 1"
rc_is 1 $C --json verify
py 'import json,sys; d=json.load(sys.stdin); assert d["bad"]==3 and d["checked"]==3, d' "verify after damage"
url=$(grep -o 'http://[0-9.:]*/metrics' "$dir/daemon.log" | head -1)
/usr/bin/python3 - "$url" <<'PY' || fail "metrics of the NVMe tier"
import re, sys, urllib.request
t = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
def v(series):
    m = re.search("^" + re.escape(series) + r" (\S+)$", t, re.M)
    assert m, series + " missing"
    return float(m.group(1))
assert v('kvtier_tier_chunks{tier="nvme"}') == 0  # all dropped by verify
assert v('kvtier_demotions_total{from="dram",to="nvme"}') == 4
assert v('kvtier_promotions_total{from="nvme",to="dram"}') == 1
assert v('kvtier_nvme_errors_total{kind="checksum"}') == 0
assert v('kvtier_nvme_verified_records_total') == 8
assert v('kvtier_tier_capacity_bytes{tier="nvme"}') == 64 << 20
PY
rc_is 0 $C verify   # the bad records are gone
grep -q "verified 0 NVMe records" "$dir/out" || fail "verify after drop: $(cat "$dir/out")"
stop

start   # no NVMe tier
rc_is 1 $C flush
grep -q "no NVMe tier" "$dir/err" || fail "flush without NVMe: $(cat "$dir/err")"
rc_is 1 $C verify
ok $C --json stats
py 'import json,sys; d=json.load(sys.stdin); assert "nvme" not in d and "nvme" not in d["tiers"], d' "stats without NVMe"
rc_is 2 $C flush --bogus
stop
[ $fails -eq 0 ] && echo "kvtierctl NVMe commands: ok"
exit $((fails > 0))
