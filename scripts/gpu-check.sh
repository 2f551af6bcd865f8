#!/usr/bin/env bash
# gpu-check.sh -- build everything, then, on a machine with an NVIDIA GPU,
# run the CUDA gather/scatter against the CPU reference bit for bit and
# print its bandwidth against cudaMemcpyAsync of the same bytes; then run
# kvtierd's GPU data path end to end on the real library (an engine with
# device tensors registers them by CUDA IPC handle, SAVEs and LOADs
# through the daemon's CUDA workers and HBM tier, checked bit for bit:
# tests/integration/test_kvcache_gpu.c with KVT_GPU_REAL=1).
#
#   scripts/gpu-check.sh [--no-bench]      (BUILD=build JOBS=$(nproc))
#
# Without a GPU it still builds everything and says what it skipped; the
# exit status is then 0 unless the build failed. With one, any mismatch,
# a library that will not load, or a run past the time limit fails.
# Finishes in well under 8 minutes (the GPU runs are limited to 5 and 2).
set -u
cd "$(dirname "$0")/.."
build=${BUILD:-build}
jobs=${JOBS:-$(nproc)}
status=0

echo "== make all (BUILD=$build)"
if ! make -j"$jobs" BUILD="$build" all; then
    echo "gpu-check: 'make all' FAILED; checking the CUDA part anyway"
    status=1
fi
# The CUDA library and the check program need nothing generated, so they
# build even while another part of the tree does not.
if ! make -j"$jobs" BUILD="$build" cuda-all; then
    echo "gpu-check: FAILED to build the CUDA part"
    exit 1
fi

lib=$build/lib/libkvtier_cuda.so
check=$build/cuda/kvt_gpu_check
if [ ! -f "$lib" ]; then
    echo "gpu-check: SKIPPED the GPU run: no nvcc, so $lib was not built"
    exit $status
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: built $lib and $check;" \
         "SKIPPED the GPU run: no NVIDIA GPU here" \
         "(nvidia-smi missing or failing)"
    exit $status
fi

nvidia-smi -L
echo "== $check $*"
KVT_CUDA_LIB=$PWD/$lib timeout -k 10 300 "$check" "$@"
rc=$?
case $rc in
    0)   echo "gpu-check: CUDA path matches the CPU reference" ;;
    77)  echo "gpu-check: FAILED: nvidia-smi sees a GPU," \
              "but kvtier cannot use it"
         status=1 ;;
    124) echo "gpu-check: FAILED: the GPU run passed its 5-minute limit"
         status=1 ;;
    *)   echo "gpu-check: FAILED (exit $rc)"
         status=1 ;;
esac

daemon_test=$build/tests/integration/test_kvcache_gpu
echo "== $daemon_test (KVT_GPU_REAL=1)"
if ! make -j"$jobs" BUILD="$build" "$daemon_test" >/dev/null; then
    echo "gpu-check: FAILED to build $daemon_test"
    exit 1
fi
KVT_GPU_REAL=1 KVTIERD=$PWD/$build/bin/kvtierd \
    timeout -k 10 120 "$daemon_test"
rc=$?
case $rc in
    0)   echo "gpu-check: kvtierd's GPU SAVE/LOAD and HBM tier match bit for bit" ;;
    77)  echo "gpu-check: FAILED: kvtierd's GPU test could not use the GPU"
         status=1 ;;
    *)   echo "gpu-check: FAILED: kvtierd's GPU test (exit $rc)"
         status=1 ;;
esac
exit $status
