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
for b in "$bench_dir"/*; do
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
