# kvtier -- plain Makefile with -MMD dependency files.
#
#   make            build everything into build/
#   make run        install missing packages, build, start kvtierd (foreground)
#   make test       install missing packages, build, run every test, then the
#                   same suite built with ASan+UBSan (into build-san/)
#   make bench      run the benchmarks (bench/), print ratios
#   make install    PREFIX=/usr/local DESTDIR=
#
# Layout of build/:  bin/ lib/ gen/ obj/ tests/ bench/

BUILD   ?= build
ifneq ($(filter . ./ $(CURDIR) $(CURDIR)/,$(BUILD)),)
$(error BUILD=$(BUILD) would scatter build outputs over the source tree; use a directory of its own)
endif
SAN     ?= 0
CC      ?= gcc
PREFIX  ?= /usr/local
VERSION := 0.1.0

OPT     ?= -O2
CFLAGS  += -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -MMD -MP -fPIC \
           -fno-strict-aliasing -DKVT_VERSION=\"$(VERSION)\"
ifeq ($(SAN),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
CPPFLAGS += -Iclient/include -Icommon -Idaemon -Itiers -Icuda -Iclient -Itests/lib -I$(BUILD)/gen

LIBS    := -lnng -lprotobuf-c -linih -lxxhash -lcrypto -lpthread -ldl -lm
# The daemon alone needs these (NVMe tier, its index, the peer tier over
# UCX, KV events over ZMQ); libkvtier does not.
DAEMON_LIBS := -luring -lrocksdb -lucp -lucs -lzmq -lcurl
TEST_LIBS := -lcmocka

GEN_C   := $(BUILD)/gen/kvtier.pb-c.c
GEN_H   := $(BUILD)/gen/kvtier.pb-c.h

COMMON_SRC := $(wildcard common/*.c)
CLIENT_SRC := $(filter-out client/kvtierctl.c,$(wildcard client/*.c))
CUDA_SRC   := $(wildcard cuda/*.c)
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c)) $(wildcard tiers/*.c) \
              $(wildcard tiers/*/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

GEN_OBJ    := $(BUILD)/obj/gen/kvtier.pb-c.o
LIB_OBJ    := $(GEN_OBJ) $(call obj,$(COMMON_SRC) $(CLIENT_SRC) $(CUDA_SRC))
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))

LIBKVT_A   := $(BUILD)/lib/libkvtier.a
LIBKVT_SO  := $(BUILD)/lib/libkvtier.so
INTERNAL_A := $(BUILD)/lib/libkvt_internal.a
KVTIERD    := $(BUILD)/bin/kvtierd
KVTIERCTL  := $(BUILD)/bin/kvtierctl

UNIT_SRC   := $(wildcard tests/unit/test_*.c)
INTEG_SRC  := $(wildcard tests/integration/test_*.c) $(wildcard tests/fault/test_*.c)
TEST_HELP  := $(call obj,$(wildcard tests/lib/*.c))
# tests/fuzz/fuzz_<name>.c: libFuzzer targets (`make fuzz`); the suite runs
# each one without libFuzzer through replay_main.c (seeds, mutations, its
# corpus-<name>/). fuzz_wire.c is replayed by tests/unit/test_fuzz_replay.
FUZZ_SRC   := $(filter-out tests/fuzz/fuzz_wire.c,$(wildcard tests/fuzz/fuzz_*.c))
TEST_BINS  := $(patsubst tests/%.c,$(BUILD)/tests/%,$(UNIT_SRC) $(INTEG_SRC) $(FUZZ_SRC))
# The membership simulator (tests/sim/): simnet.c is the engine, simidx.c
# the global index on top of it, shared by the swim unit test and the
# swimsim scenarios (make test, make bench).
SIM_LIB    := $(call obj,tests/sim/simnet.c tests/sim/simidx.c)
SIM_BINS   := $(BUILD)/tests/sim/swimsim
BENCH_SRC  := $(wildcard bench/*.c)
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all deps run test test-bin test-engines check-unit bench bench-engines install clean fuzz
.DEFAULT_GOAL := all

EXAMPLES   := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))

all: $(KVTIERD) $(KVTIERCTL) $(LIBKVT_SO) $(LIBKVT_A) $(BUILD)/lib/kvtier.pc $(EXAMPLES)

deps:
	@scripts/deps.sh

# ---------------------------------------------------------------- protobuf
$(GEN_C) $(GEN_H): proto/kvtier.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen proto/kvtier.proto

$(GEN_OBJ): $(GEN_C)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(filter-out -Wextra,$(CFLAGS)) -c $< -o $@

# Every object may include the generated header.
$(BUILD)/obj/%.o: %.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The AVX2 build of the checksum; called only where the CPU has AVX2.
$(BUILD)/obj/common/checksum_avx2.o: CFLAGS += -mavx2

# ---------------------------------------------------------------- libraries
$(LIBKVT_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The real file carries its SONAME's name; libkvtier.so is the link-time
# name, so programs linked against the build tree start from it too.
$(LIBKVT_SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libkvtier.so.0 $(LDFLAGS) $^ -o $@.0 $(LIBS)
	ln -sf libkvtier.so.0 $@

$(INTERNAL_A): $(LIB_OBJ) $(DAEMON_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/kvtier.pc: client/kvtier.pc.in Makefile
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

# ---------------------------------------------------------------- programs
$(KVTIERD): $(BUILD)/obj/daemon/main.o $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS) $(DAEMON_LIBS)

$(KVTIERCTL): $(BUILD)/obj/client/kvtierctl.o $(LIBKVT_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS)

$(BUILD)/tests/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(BUILD)/obj/tests/fuzz/replay_main.o \
                       $(TEST_HELP) $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS) $(DAEMON_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_HELP) $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS) $(DAEMON_LIBS) $(TEST_LIBS)

$(BUILD)/obj/tests/sim/%.o $(BUILD)/obj/tests/unit/test_swim.o: \
    CPPFLAGS += -Itiers/peer -Itests/sim
$(BUILD)/tests/unit/test_swim: $(SIM_LIB)
$(BUILD)/tests/sim/%: $(BUILD)/obj/tests/sim/%.o $(SIM_LIB) $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS)

# Examples build as a user would: the public header and libkvtier.a only.
$(BUILD)/examples/%: examples/%.c $(LIBKVT_A) client/include/kvtier.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Werror $(filter -fsanitize%,$(CFLAGS)) -Iclient/include $< $(LIBKVT_A) -o $@ $(LDFLAGS) $(LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS) $(DAEMON_LIBS) -lhiredis

# The etcd fleet bench starts a real etcd with the tests' helper.
$(BUILD)/bench/bench_etcdfleet: $(BUILD)/obj/bench/bench_etcdfleet.o $(TEST_HELP) $(INTERNAL_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LIBS) $(DAEMON_LIBS) $(TEST_LIBS)

-include cuda/cuda.mk

# ---------------------------------------------------------------- fuzzing
# libFuzzer over the request decoder and handlers (needs clang). Inputs it
# keeps land in tests/fuzz/corpus/, which the unit suite replays.
FUZZ_SECONDS ?= 60
FUZZ_CC := clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
           -DKVT_VERSION=\"$(VERSION)\" $(CPPFLAGS) -Itests/fuzz
FUZZ_ALL := $(GEN_C) $(COMMON_SRC) $(DAEMON_SRC) $(CUDA_SRC)
# FUZZ_TARGETS="peer nvme": only those (names of tests/fuzz/fuzz_<name>.c).
FUZZ_TARGETS ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_RUN := $(filter $(patsubst %,tests/fuzz/fuzz_%.c,$(FUZZ_TARGETS)),$(FUZZ_SRC))
fuzz: $(GEN_C) $(patsubst tests/%.c,$(BUILD)/tests/%,$(FUZZ_RUN))
	@command -v clang >/dev/null || { echo "make fuzz needs clang (apt-get install clang)"; exit 1; }
	@mkdir -p build-fuzz tests/fuzz/corpus
ifneq ($(filter wire,$(FUZZ_TARGETS)),)
	$(FUZZ_CC) tests/fuzz/fuzz_wire.c tests/lib/fuzz_harness.c $(FUZZ_ALL) \
	    -o build-fuzz/fuzz_wire $(LIBS) $(DAEMON_LIBS)
	build-fuzz/fuzz_wire -max_total_time=$(FUZZ_SECONDS) -max_len=4096 tests/fuzz/corpus
endif
	@for t in $(FUZZ_RUN); do n=$$(basename $$t .c); n=$${n#fuzz_}; \
	    mkdir -p tests/fuzz/corpus-$$n && \
	    $(BUILD)/tests/fuzz/fuzz_$$n --seeds tests/fuzz/corpus-$$n && \
	    echo "$(FUZZ_CC) $$t ... -o build-fuzz/fuzz_$$n" && \
	    $(FUZZ_CC) $$t $(FUZZ_ALL) -o build-fuzz/fuzz_$$n $(LIBS) $(DAEMON_LIBS) && \
	    build-fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	        tests/fuzz/corpus-$$n || exit 1; done

# ---------------------------------------------------------------- targets
# The NVMe tier is off in the key table's defaults (every test daemon would
# carry one); `make run` turns it on: 4 GiB under ./var/nvme, grown lazily.
run: deps all
	@mkdir -p var
	exec $(KVTIERD) --socket ipc://$(CURDIR)/var/kvtierd.sock --state-dir $(CURDIR)/var \
	    --nvme.nvme_bytes 4G

test-bin: all $(TEST_BINS) $(SIM_BINS)

test: deps
	$(MAKE) test-bin
	scripts/run-tests.sh $(BUILD)
	$(MAKE) BUILD=build-san SAN=1 OPT=-O1 test-bin
	KVT_SAN=1 scripts/run-tests.sh build-san
	@if [ -n "$(KVT_SKIP_ENGINES)" ] && [ "$(KVT_SKIP_ENGINES)" != 0 ]; then \
	    echo "test-engines left out (KVT_SKIP_ENGINES=$(KVT_SKIP_ENGINES))"; \
	else $(MAKE) test-engines; fi

# kvtier inside real vLLM and SGLang (their packages from PyPI, in a virtual
# environment cached under ~/.cache/kvtier; the first run downloads ~3 GB).
test-engines: deps all
	scripts/run-engine-tests.sh $(BUILD)

bench: deps all $(BENCH_BINS) $(SIM_BINS)
	scripts/run-bench.sh $(BUILD)

# Engine benchmarks only (time to first token in real vLLM, workload replay).
bench-engines: deps all
	scripts/run-bench.sh $(BUILD) engines

# Directories follow PREFIX; /etc only for PREFIX=/usr (a distro layout).
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
UNITDIR    ?= $(PREFIX)/lib/systemd/system
MANDIR     ?= $(PREFIX)/share/man
I_UNIT     := $(DESTDIR)$(UNITDIR)/kvtierd.service
I_CONF     := $(DESTDIR)$(SYSCONFDIR)/kvtier/kvtierd.conf

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(KVTIERD) $(KVTIERCTL) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(LIBKVT_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(LIBKVT_SO).0 $(DESTDIR)$(PREFIX)/lib/libkvtier.so.0
	ln -sf libkvtier.so.0 $(DESTDIR)$(PREFIX)/lib/libkvtier.so
	install -m 0644 client/include/kvtier.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' client/kvtier.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvtier.pc
	install -d $(dir $(I_UNIT)) $(dir $(I_CONF)) $(DESTDIR)$(PREFIX)/lib/sysusers.d \
	    $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	sed -e 's|/usr/bin/|$(PREFIX)/bin/|g' -e 's|/etc/kvtier/|$(SYSCONFDIR)/kvtier/|g' \
	    deploy/kvtierd.service > $(I_UNIT) && chmod 0644 $(I_UNIT)
	install -m 0644 deploy/sysusers/kvtier.conf $(DESTDIR)$(PREFIX)/lib/sysusers.d/
	[ -e $(I_CONF) ] || install -m 0644 deploy/kvtierd.conf $(I_CONF)
	install -m 0644 man/kvtierctl.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 man/kvtier.conf.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 man/kvtierd.8 $(DESTDIR)$(MANDIR)/man8/

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
