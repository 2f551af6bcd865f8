#!/bin/bash
# bench_conns.sh -- what each idle daemon of a small cluster costs in open
# files and memory: N real daemons in one insecure cluster on loopback,
# UCX over tcp, left SETTLE seconds to converge, then per daemon the
# entries of /proc/PID/fd (all, and sockets among them), VmRSS and
# threads (min / median / max over the N). Every daemon is killed (-9) at
# the end, whatever happens, and its files removed.
#
#   bench/bench_conns.sh [N=20] [settle_s=20] [kvtierd=build/bin/kvtierd]
#   EXTRA="--cluster.max_conns 4" bench/bench_conns.sh    (more daemon args)
#
# Run it once with each binary to compare (e.g. one built from an older
# commit); the figures are this machine's, so compare runs made here.
set -u
N=${1:-20}
SETTLE=${2:-20}
BIN=$(realpath "${3:-build/bin/kvtierd}")
dir=$(mktemp -d /tmp/kvt-conns.XXXXXX)
pids=()
cleanup() {
    kill -9 "${pids[@]}" 2>/dev/null
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM
export UCX_TLS=${UCX_TLS:-tcp}
. "$(dirname "$0")/fleet_start.sh"
# shellcheck disable=SC2086 # EXTRA is a list of arguments
fleet_start "$N" "$BIN" "$dir" ${EXTRA:-}
sleep "$SETTLE"
alive=0
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
[ "$alive" = "$N" ] || { echo "only $alive of $N daemons running:"; tail -n 3 "$dir"/n2/log; exit 1; }
# min / median / max of the numbers on stdin
stats() { sort -n | awk '{v[NR] = $1} END {printf "%d / %d / %d", v[1], v[int((NR + 1) / 2)], v[NR]}'; }
fds() { for p in "${pids[@]}"; do ls /proc/$p/fd | wc -l; done; }
socks() {
    for p in "${pids[@]}"; do
        find /proc/$p/fd -lname 'socket:*' 2>/dev/null | wc -l
    done
}
rss() { for p in "${pids[@]}"; do awk '/^VmRSS/ {print $2}' /proc/$p/status; done; }
thr() { for p in "${pids[@]}"; do awk '/^Threads/ {print $2}' /proc/$p/status; done; }
eps=$(grep -h "UCX endpoint" "$dir"/n*/log | wc -l)
echo "$N idle daemons ($(basename "$BIN") $(git -C "$(dirname "$BIN")" rev-parse --short HEAD 2>/dev/null)${EXTRA:+ $EXTRA}), min / median / max per daemon after ${SETTLE}s:"
echo "  fds:      $(fds | stats)"
echo "  sockets:  $(socks | stats)"
echo "  VmRSS kB: $(rss | stats)"
echo "  threads:  $(thr | stats)"
echo "  UCX endpoint log lines, all daemons: $eps"
