# cuda/cuda.mk -- the CUDA half of kvtier, included by the root Makefile.
#
# Builds, into $(BUILD):
#   lib/libkvtier_cuda.so  nvcc; cudart linked statically and every symbol
#                          but kvt_cuda_ops_get hidden, so dlopen needs only
#                          the driver (libcuda.so.1) and nothing leaks into
#                          the process that loads it
#   cuda/kvt_gpu_check     plain C: dlopens the library through
#                          kvt_gpu_open and checks the CUDA path against the
#                          CPU reference bit for bit (scripts/gpu-check.sh)
#   tests/unit/test_cuda_emu  the kernel's own code on an emulated grid
#                          against the CPU reference; needs nvcc, not a GPU,
#                          so `make test` runs it everywhere nvcc exists
#   lib/libkvtier_fakecuda.so  the same ops table done on the CPU
#                          (tests/fake_cuda/fake_cuda.c): tests load it with
#                          KVT_CUDA_LIB to drive kvtierd's GPU paths without a
#                          GPU. Plain C, built for test-bin in every build
#                          (without sanitizers: it is dlopened)
#
# nvcc is optional: NVCC from the environment, else nvcc on PATH, else
# /usr/local/cuda/bin/nvcc; with none, one line says so and the library is
# skipped (everything else, the CPU reference included, still builds). The
# sanitizer build (SAN=1) skips both: its tests then see "not found",
# which they accept.

ifeq ($(origin NVCC),undefined)
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
endif

NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -std=c++20 -O3 -g $(NVCC_ARCH) -Werror all-warnings \
             -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fvisibility=hidden

KVT_CUDA_SO   := $(BUILD)/lib/libkvtier_cuda.so
KVT_GPU_CHECK := $(BUILD)/cuda/kvt_gpu_check
KVT_CUDA_EMU  := $(BUILD)/tests/unit/test_cuda_emu
CUDA_SO_OBJ   := $(BUILD)/obj/cuda-so
CUDA_HDRS     := cuda/kvt_cuda_api.h cuda/layout.h client/include/kvtier.h
GPU_CHECK_SRC := cuda/test/gpu_check.c cuda/layout.c cuda/gather_cpu.c cuda/gpu.c
GPU_CHECK_HDR := cuda/test/fixture.h cuda/gpu.h $(CUDA_HDRS)

.PHONY: cuda-all

KVT_FAKE_CUDA := $(BUILD)/lib/libkvtier_fakecuda.so
test-bin: $(KVT_FAKE_CUDA)

$(KVT_FAKE_CUDA): tests/fake_cuda/fake_cuda.c cuda/gather_cpu.c cuda/layout.c \
                  $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -fPIC -shared \
	    -fvisibility=hidden -Iclient/include -Icuda tests/fake_cuda/fake_cuda.c \
	    cuda/gather_cpu.c cuda/layout.c -o $@ -lpthread

ifneq ($(SAN),1)
all: $(KVT_GPU_CHECK)
cuda-all: $(KVT_GPU_CHECK)

ifeq ($(NVCC),)
$(info cuda.mk: no nvcc (set NVCC=/path/to/nvcc); skipping libkvtier_cuda.so)
else
all: $(KVT_CUDA_SO)
cuda-all: $(KVT_CUDA_SO)
test-bin: $(KVT_CUDA_EMU)
endif
endif

$(CUDA_SO_OBJ)/kvt_cuda.o: cuda/kvt_cuda.cu $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iclient/include -Icuda -c $< -o $@

# layout.c again, hidden inside the library (it validates block ids there);
# gather_cpu.c for the emulation test.
$(CUDA_SO_OBJ)/%.o: cuda/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fvisibility=hidden -c $< -o $@

$(CUDA_SO_OBJ)/emu_check.o: cuda/test/emu_check.cu cuda/kvt_cuda.cu \
                            cuda/test/fixture.h $(CUDA_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iclient/include -Icuda -c $< -o $@

$(KVT_CUDA_EMU): $(CUDA_SO_OBJ)/emu_check.o $(CUDA_SO_OBJ)/layout.o \
                 $(CUDA_SO_OBJ)/gather_cpu.o
	@mkdir -p $(dir $@)
	$(NVCC) -cudart static $(NVCC_ARCH) $^ -o $@ -ldl -lpthread -lrt

$(KVT_CUDA_SO): $(CUDA_SO_OBJ)/kvt_cuda.o $(CUDA_SO_OBJ)/layout.o
	@mkdir -p $(dir $@)
	$(NVCC) -shared -cudart static $(NVCC_ARCH) \
	    -Xlinker --exclude-libs,ALL -Xlinker -z,defs $^ -o $@ \
	    -ldl -lpthread -lrt

# Needs no generated headers, so it builds even while the rest of the
# tree does not (scripts/gpu-check.sh relies on that).
$(KVT_GPU_CHECK): $(GPU_CHECK_SRC) $(GPU_CHECK_HDR)
	@mkdir -p $(dir $@)
	$(CC) -Iclient/include -Icuda $(filter-out -MMD -MP,$(CFLAGS)) \
	    $(LDFLAGS) $(GPU_CHECK_SRC) -o $@ -lpthread -ldl
