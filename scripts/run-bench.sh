#!/usr/bin/env bash
# run-bench.sh BUILD_DIR -- run every benchmark in BUILD_DIR/bench/, in turn.
#
# Each bench starts its own daemons (kvtierd from $KVTIERD, set here to
# BUILD_DIR/bin/kvtierd unless already set) and prints one line per figure,
# every figure a ratio against a baseline measured in the same run. A missed
# target is a result, not a failure: this script fails only if a bench could
# not run (crashed, was killed, timed out, or exited non-zero). Exit 77 from
# a bench means "skipped: this machine lacks something" and is not a failure.
set -uo pipefail

build=${1:-build}
only=${2:-}          # "engines": only the engine benchmarks (make bench-engines)
bench_dir="$build/bench"
timeout_s=${BENCH_TIMEOUT:-300}

if [ ! -d "$bench_dir" ]; then
  echo "run-bench.sh: no $bench_dir (build the benches first: make bench)" >&2
  exit 2
fi
export KVTIERD=${KVTIERD:-$build/bin/kvtierd}
if [ ! -x "$KVTIERD" ]; then
  echo "run-bench.sh: no kvtierd at $KVTIERD" >&2
  exit 2
fi

model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
echo "== kvtier benchmarks"
echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "machine: $(nproc) CPUs, ${model:-unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM"
echo "kernel:  $(uname -sr)"
echo "kvtierd: $KVTIERD"
echo

failed=()
skipped=()
ran=0
run_py() { # name, python, script
  local name=$1 py=$2 script=$3 start rc
  echo "== $name"
  start=$(date +%s)
  KVTIER_BUILD=$PWD/$build timeout --signal=TERM --kill-after=10 "${ENGINE_BENCH_TIMEOUT:-2400}" "$py" "$script"
  rc=$?
  ran=$((ran + 1))
  if [ $rc -eq 0 ]; then echo "-- $name: done in $(( $(date +%s) - start )) s"
  else echo "-- $name: FAILED: exit status $rc"; failed+=("$name"); fi
  echo
}

for b in "$bench_dir"/*; do
  [ -n "$only" ] && break
  [ -f "$b" ] && [ -x "$b" ] || continue
  name=$(basename "$b")
  echo "== $name"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$timeout_s" "$b"
  rc=$?
  ran=$((ran + 1))
  case $rc in
    0) echo "-- $name: done in $(( $(date +%s) - start )) s" ;;
    77) echo "-- $name: skipped"; skipped+=("$name") ;;
    124) echo "-- $name: FAILED: timed out after ${timeout_s} s"; failed+=("$name") ;;
    *)
      if [ "$rc" -gt 128 ]; then
        echo "-- $name: FAILED: killed by signal $((rc - 128))"
      else
        echo "-- $name: FAILED: exit status $rc"
      fi
      failed+=("$name") ;;
  esac
  echo
done

# Shutdown of a 60-daemon cluster on loopback (bench/bench_shutdown.sh):
# idle CPU while converged, and how long a SIGTERM to all takes.
if [ -z "$only" ] && [ -z "${SKIP_SHUTDOWN_BENCH:-}" ]; then
  echo "== bench_shutdown"
  ran=$((ran + 1))
  if bench/bench_shutdown.sh "${SHUTDOWN_BENCH_N:-60}" 25 "$build/bin/kvtierd"; then
    echo "-- bench_shutdown: done"
  else echo "-- bench_shutdown: FAILED"; failed+=(bench_shutdown); fi
  echo
fi

# Open files and memory per idle daemon of a 20-node cluster
# (bench/bench_conns.sh).
if [ -z "$only" ] && [ -z "${SKIP_CONNS_BENCH:-}" ]; then
  echo "== bench_conns"
  ran=$((ran + 1))
  if bench/bench_conns.sh 20 20 "$build/bin/kvtierd"; then
    echo "-- bench_conns: done"
  else echo "-- bench_conns: FAILED"; failed+=(bench_conns); fi
  echo
fi

# The membership simulator (tests/sim/swimsim): the real swim.c on 10, 100
# and 1000 simulated nodes under every injection of the scenario table.
if [ -z "$only" ] && [ -x "$build/tests/sim/swimsim" ]; then
  echo "== swimsim"
  start=$(date +%s)
  timeout --signal=TERM --kill-after=10 "${SIM_BENCH_TIMEOUT:-3600}" \
    "$build/tests/sim/swimsim" --bench ${SIM_BENCH_SIZES:-10 100 1000}
  rc=$?
  ran=$((ran + 1))
  if [ $rc -eq 0 ]; then echo "-- swimsim: done in $(( $(date +%s) - start )) s"
  else echo "-- swimsim: FAILED: exit status $rc"; failed+=(swimsim); fi
  echo
fi

# Engine benchmarks: replay through the Python client (standard library),
# time to first token in real vLLM (the engines environment).
export KVTIERCTL=${KVTIERCTL:-$PWD/$build/bin/kvtierctl}
run_py bench_replay /usr/bin/python3 bench/engines/bench_replay.py
if py=$(scripts/engines-env.sh); then
  run_py bench_ttft "$py" bench/engines/bench_ttft.py
else
  echo "-- bench_ttft: FAILED: the engines environment could not be built"; failed+=(bench_ttft)
fi

if [ "$ran" -eq 0 ]; then
  echo "run-bench.sh: no bench binaries in $bench_dir" >&2
  exit 2
fi
echo "== $ran benches, ${#failed[@]} failed, ${#skipped[@]} skipped"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
exit 0
