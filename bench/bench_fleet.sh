#!/bin/bash
# bench_fleet.sh -- real daemons against the membership simulator: N real
# kvtierd in one insecure cluster on loopback (N = 20 and 60 unless given),
# on the embedded SWIM backend and, when etcd is installed, on etcd: idle
# membership messages, bytes and CPU per daemon, fds and RSS, crash
# detection (kill -9), join and leave convergence, shutdown of all at once;
# then tests/sim/swimsim at the same N and the two side by side. The
# membership knobs are the daemon's defaults. bench/bench_fleet.py does
# the work; every daemon and etcd it starts is killed when it exits.
#
#   bench/bench_fleet.sh [N...] [--backends swim,etcd] [--idle S] [--no-sim]
#   (kvtierd from $KVTIERD, else build/bin/kvtierd; kvtierctl and swimsim
#   from the same build directory)
set -u
here=$(dirname "$(realpath "$0")")
command -v python3 >/dev/null || { echo "bench_fleet: no python3" >&2; exit 77; }
exec python3 "$here/bench_fleet.py" "$@"
