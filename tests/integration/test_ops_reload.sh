#!/usr/bin/env bash
# SIGHUP reload, observed from outside as an operator would: watermarks in
# `kvtierctl stats --json` and lines in the log. Reloadable keys change at
# once (one log line each), a new log level takes effect, a key that needs
# a restart is reported and kept, and a broken or missing file changes
# nothing. Then SIGTERM with a client connected exits 0.
set -u
tmp=$(mktemp -d /tmp/kvt-reload-XXXXXX)
pool=/dev/shm/kvt-reload-$$.pool
sock=$tmp/kvtierd.sock
conf=$tmp/kvtierd.conf
log=$tmp/kvtierd.log
pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    rm -rf "$tmp" "$pool"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- log"; cat "$log"; exit 1; }

write_conf() { # log_level high low [extra line]
    printf '[daemon]\nlog_level = %s\n%s\n[dram]\nhigh_watermark = %s\nlow_watermark = %s\n[metrics]\nlisten =\n' \
        "$1" "${4:-}" "$2" "$3" > "$conf"
}
marks() {
    "$KVTIERCTL" --socket "$sock" stats --json |
        /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["high_watermark"], d["low_watermark"])'
}
wait_for() { # command... : poll up to 10 s
    for _ in $(seq 200); do "$@" && return 0; sleep 0.05; done
    return 1
}
marks_are() { [ "$(marks)" = "$1" ]; }
log_count() { grep -c -- "$1" "$log"; }
count_is() { [ "$(log_count "$1")" -ge "$2" ]; }

write_conf info 0.95 0.85
"$KVTIERD" --config "$conf" --socket "ipc://$sock" --state-dir "$tmp" \
    --pool-path "$pool" --pool-bytes 64M 2>"$log" &
pid=$!
wait_for "$KVTIERCTL" --socket "$sock" status >/dev/null 2>&1 || fail "daemon did not start"
P=67108864
marks_are "$((P * 95 / 100)) $((P * 85 / 100))" || fail "initial watermarks: $(marks)"

# Reloadable keys: applied, one line each, level change logged before it bites.
write_conf warn 0.5 0.4
kill -HUP $pid
wait_for marks_are "$((P / 2)) 26843545" || fail "watermarks not reloaded: $(marks)"
grep -q "config: dram.high_watermark: 0.95 -> 0.5" "$log" || fail "no high_watermark line"
grep -q "config: dram.low_watermark: 0.85 -> 0.4" "$log" || fail "no low_watermark line"
grep -q "config: daemon.log_level: info -> warn" "$log" || fail "no log_level line"

# At warn, an info change line is no longer written: the level took effect.
write_conf warn 0.5 0.3
kill -HUP $pid
wait_for marks_are "$((P / 2)) 20132659" || fail "second reload: $(marks)"
grep -q "low_watermark: 0.4 -> 0.3" "$log" && fail "info line written at level warn"

# A key that needs a restart is reported (warn) and kept.
write_conf info 0.5 0.3 "contexts = 16"
kill -HUP $pid
wait_for grep -q "daemon.contexts: 32 -> 16 takes a restart; keeping 32" "$log" ||
    fail "no restart warning for contexts"

# Broken file: nothing changes, the reason is logged.
write_conf info 1.5 0.3
kill -HUP $pid
wait_for count_is "reload failed, running settings kept" 1 || fail "bad value not reported"
grep -q "reload failed, running settings kept: $conf: line 5: dram.high_watermark = '1.5'" "$log" ||
    fail "bad value message lacks the line"
marks_are "$((P / 2)) 20132659" || fail "bad reload changed watermarks: $(marks)"

# Missing file: the same.
rm -f "$conf"
kill -HUP $pid
wait_for count_is "reload failed, running settings kept" 2 || fail "missing file not reported"
marks_are "$((P / 2)) 20132659" || fail "missing file changed watermarks"

# SIGTERM with a client connected (a put streaming from a fifo): exit 0.
mkfifo "$tmp/fifo"
"$KVTIERCTL" --socket "$sock" put --ns reload --key "$(printf 'ab%.0s' $(seq 32))" "$tmp/fifo" &
ctl=$!
exec 3>"$tmp/fifo"
clients() {
    "$KVTIERCTL" --socket "$sock" stats --json |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["clients"])'
}
two_clients() { [ "$(clients)" -ge 2 ]; } # the put's and the stats' own
wait_for two_clients || fail "the put client never connected"
kill -TERM $pid
wait $pid
rc=$?
exec 3>&-
wait $ctl 2>/dev/null
pid=
[ $rc -eq 0 ] || fail "kvtierd exited $rc after SIGTERM"
grep -q "main: stopped" "$log" || fail "no stop line"
echo "reload test passed"
