#!/bin/bash
# bench_shutdown.sh -- N real daemons in one insecure cluster on loopback:
# the CPU they burn while converged and idle (CPU-seconds per 10 s, all
# of them together, from /proc), then all sent SIGTERM at once: how long
# until every one exited, how many exited 0, how many hit the cluster's
# socket-close bound or the stop guard. Leftovers are killed (-9) at the
# end whatever happens.
#
#   bench/bench_shutdown.sh [N=60] [settle_s=25] [kvtierd=build/bin/kvtierd]
set -u
N=${1:-60}
SETTLE=${2:-25}
BIN=$(realpath "${3:-build/bin/kvtierd}")
dir=$(mktemp -d /tmp/kvt-shut.XXXXXX)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
. "$(dirname "$0")/fleet_start.sh"
fleet_start "$N" "$BIN" "$dir"
sleep "$SETTLE"
ticks() { # utime + stime of every daemon, in clock ticks
    local t=0
    for p in "${pids[@]}"; do
        [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat)))
    done
    echo $t
}
hz=$(getconf CLK_TCK)
t1=$(ticks); sleep 10; t2=$(ticks)
echo "idle: $N daemons burn $(echo "scale=2; ($t2 - $t1) / $hz" | bc) CPU-s per 10 s together"
t0=$(date +%s.%N)
kill -TERM "${pids[@]}"
ok=0
# bounded: drain (5 s) + stop (15 s) + slack, then counted as hung
for _ in $(seq 1 120); do
    left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1 && break; done
    [ $left = 0 ] && break
    sleep 0.5
done
el=$(echo "$(date +%s.%N) - $t0" | bc)
hung=0
for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then hung=$((hung + 1)); else wait "$p" && ok=$((ok + 1)); fi
done
cb=$(grep -l "did not close within" "$dir"/n*/log | wc -l)
gd=$(grep -l "stop did not finish" "$dir"/n*/log | wc -l)
echo "stop: $N daemons sent SIGTERM together: $hung still running after ${el}s, $ok exited 0; close bound hit by $cb, stop guard by $gd"
