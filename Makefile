# vitc — self-attention for computer vision, in C.
#
#   make            build/libvitc.so, build/libvitc.a, build/vitc
#   make test       install what is missing (Debian packages, .venv), build, run C and Python tests
#   make deps       only that install (scripts/install-deps.sh); deps-system: Debian only
#   make demo       run every seed block on the seeds' shapes
#   make bench      vitc, PyTorch and the other engines side by side, writes bench/results.md
#   make bench-ort  its ViT-B/16 rows on every engine alone, into bench/results-ort.md
#   make bench-train  Fashion-MNIST training end to end vs PyTorch + DataLoader
#   make bench-finetune  fine-tuning from random init learns: bench/results-finetune.md
#   make bench-text  text tower, tokenizer, zero-shot cache vs the peers: bench/results-text.md
#   make bench-dense  SAM and Depth Anything vs torch and OpenVINO: bench/results-dense.md
#   make check-optout  build with each of NO_BLAS/NO_PNG/NO_JPEG/NO_ZLIB and all four + NO_TEXT,
#                   -Werror, and run the C tests of each
#   make check-generic  the build of a target without SIMD kernels (KERNEL_ARCH=generic:
#                   no src/kernels/x86/ file), -Werror, and its C tests
#   make asan       the C tests under AddressSanitizer + UBSan
#   make tsan       tests/test_session.c (threads sharing one model) and
#                   tests/test_serve_core.c (serve's batcher) under ThreadSanitizer
#   make valgrind   the C tests under valgrind memcheck
#   make fuzz       every libFuzzer target FUZZ_SECONDS (60) seconds (clang)
#   make fuzz-build build them only, in build-fuzz/
#   make install PREFIX=/usr/local DESTDIR=
#   make MPI=1      build/vitc with data-parallel `vitc train` and sharded `vitc embed`
#                   (OpenMPI, mpicc); make test builds that one as build-mpi/vitc
#
# Optional libraries are found with pkg-config and used when present:
# OpenBLAS (GEMM backend), libpng and libturbojpeg (images), zlib (gzip IDX
# and open_clip's vocabulary), utf8proc (the text tokenizers).
# NO_BLAS=1, NO_PNG=1, NO_JPEG=1, NO_ZLIB=1, NO_TEXT=1 build without them
# (make check-optout builds each way). jansson (JSON) is required.

VERSION   := 0.1.0
SOVERSION := 0
# VERSION is the one version number (CHANGELOG.md): setup.py reads it for the
# Python package, vitc.pc gets it at install. The public header carries it for
# compilers that never see this file, so a build refuses a header that lags.
HDR_VERSION := $(shell sed -n 's/^\#define VITC_VERSION_STRING "\(.*\)"/\1/p' include/vitc.h)
HDR_PARTS   := $(shell sed -n 's/^\#define VITC_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' include/vitc.h)
empty :=
space := $(empty) $(empty)
HDR_DOTTED  := $(subst $(space),.,$(HDR_PARTS))
ifneq ($(HDR_VERSION) $(HDR_DOTTED),$(VERSION) $(VERSION))
$(error include/vitc.h says version $(HDR_VERSION) (parts $(HDR_DOTTED)), the Makefile's VERSION is $(VERSION): set VITC_VERSION_STRING and VITC_VERSION_MAJOR/MINOR/PATCH to match)
endif
PREFIX    ?= /usr/local
DESTDIR   ?=
BUILD     ?= build
# The tests' and the benchmark's Python: the virtual environment that
# scripts/install-deps.sh makes from requirements-dev.txt (torch 2.x,
# transformers, timm, open_clip, ONNX Runtime, OpenVINO).
VENV      ?= .venv
PYTHON    ?= $(VENV)/bin/python

CC      ?= cc
# No -ffast-math: it breaks NaN/inf semantics and parity with PyTorch.
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
# -Werror only where the warnings are known: the tree builds warning-free
# with Debian 12's gcc 12 (and with clang 14 for the fuzz targets), so that
# compiler gets it by default and CI (.ci/run) sets WERROR=1 for all of
# them. Another compiler's new warnings must not fail a user's build:
# WERROR=0 turns it off, WERROR=1 on, whatever the compiler.
# (clang defines __GNUC__ 4, gcc its major version.)
CC_MACROS   := $(shell $(CC) -dM -E -x c /dev/null 2>/dev/null | grep -E '__clang__|__GNUC__ ')
CC_IS_GCC12 := $(if $(findstring __clang__,$(CC_MACROS)),,$(findstring __GNUC__ 12,$(CC_MACROS)))
WERROR  ?= $(if $(CC_IS_GCC12),1,0)
WARN    := -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror -Wno-error=unused-function)
BASE    := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -Iinclude -Isrc $(WARN)
LDLIBS  := -lm -lpthread

PKG := pkg-config
# Quiet by default; V=1 shows the commands.
Q := $(if $(V),,@)
define have
$(shell $(PKG) --exists $(1) 2>/dev/null && echo 1)
endef

JANSSON_CFLAGS := $(shell $(PKG) --cflags jansson 2>/dev/null)
JANSSON_LIBS   := $(shell $(PKG) --libs jansson 2>/dev/null || echo -ljansson)
BASE   += $(JANSSON_CFLAGS)
LDLIBS += $(JANSSON_LIBS)

ifneq ($(NO_BLAS),1)
ifeq ($(call have,openblas),1)
BASE   += -DVITC_HAVE_OPENBLAS $(shell $(PKG) --cflags openblas)
LDLIBS += $(shell $(PKG) --libs openblas)
endif
endif
ifneq ($(NO_PNG),1)
ifeq ($(call have,libpng),1)
BASE   += -DVITC_HAVE_PNG $(shell $(PKG) --cflags libpng)
LDLIBS += $(shell $(PKG) --libs libpng)
endif
endif
# zlib reads gzip IDX files (Fashion-MNIST as Debian ships it); without it
# only raw IDX files are read.
ifneq ($(NO_ZLIB),1)
ifeq ($(call have,zlib),1)
BASE   += -DVITC_HAVE_ZLIB $(shell $(PKG) --cflags zlib)
LDLIBS += $(shell $(PKG) --libs zlib)
endif
endif
ifneq ($(NO_JPEG),1)
ifeq ($(call have,libturbojpeg),1)
BASE   += -DVITC_HAVE_TURBOJPEG $(shell $(PKG) --cflags libturbojpeg)
LDLIBS += $(shell $(PKG) --libs libturbojpeg)
endif
endif

# utf8proc (Unicode normalisation, general categories, case) makes the
# text tokenizers (src/text/): CLIP's split pattern is a scan over its
# categories, not a regex engine, so that the quirks of the reference's
# case-insensitive regex are reproduced exactly (docs/tokenizers.md).
# Without it (NO_TEXT=1, or not installed) a tokenizer refuses to load with
# a message saying so, and the rest works.
ifneq ($(NO_TEXT),1)
ifeq ($(call have,libutf8proc),1)
BASE   += -DVITC_HAVE_TEXT $(shell $(PKG) --cflags libutf8proc)
LDLIBS += $(shell $(PKG) --libs libutf8proc)
endif
endif

# libmicrohttpd makes `vitc serve` (docs/serve.md); only the vitc binary
# links it, never the library. Without it (NO_SERVE=1, or not installed)
# `vitc serve` says it was built without it.
SERVE_LIBS :=
ifneq ($(NO_SERVE),1)
ifeq ($(call have,libmicrohttpd),1)
SERVE_CFLAGS := -DVITC_HAVE_MHD $(shell $(PKG) --cflags libmicrohttpd)
SERVE_LIBS   := $(shell $(PKG) --libs libmicrohttpd)
endif
endif

# Each ISA file is compiled with its own flags; the rest of the library stays
# portable and the choice is made at run time (src/kernels/dispatch.c). The
# ISA files live in one folder per target architecture (src/kernels/x86/),
# built only for that target: KERNEL_ARCH is the folder, from the compiler's
# target (uname -m when it says nothing); generic (or any machine without a
# folder) builds the portable kernels alone. `make KERNEL_ARCH=generic`
# checks that build on an x86 host.
TARGET_MACHINE := $(or $(shell $(CC) -dumpmachine 2>/dev/null),$(shell uname -m))
KERNEL_ARCH ?= $(if $(filter x86_64-% x86_64 amd64-% amd64,$(TARGET_MACHINE)),x86,generic)
KERNEL_ARCH_DIRS := x86
ifneq ($(filter $(KERNEL_ARCH),$(KERNEL_ARCH_DIRS)),)
KERNEL_DIR := src/kernels/$(KERNEL_ARCH)
endif

ifeq ($(KERNEL_ARCH),x86)
BASE += -DVITC_KERNELS_X86
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mavx2
AVX2_FLAGS   := -mavx2 -mfma
# The bf16 / int8 microkernels also need these (used only when cpuid says so).
$(BUILD)/obj/src/kernels/x86/gemm_lp_avx512.o: AVX512_FLAGS += -mavx512bf16 -mavx512vnni
$(BUILD)/obj/src/kernels/x86/gemm_lp_avx2.o: AVX2_FLAGS += -mavxvnni
# AMX tile instructions (chosen only where cpuid, XCR0 and the OS allow);
# its emulation (gemm_lp_amx_emul.c, the same kernel source) needs nothing.
$(BUILD)/obj/src/kernels/x86/gemm_lp_amx.o: BASE += -mamx-tile -mamx-bf16 -mamx-int8
endif

# src/*/*.c stops above the arch folders (and the model families' folder,
# named); an *_avx2.c / *_avx512.c outside them (src/train/optim_avx512.c) is
# x86 code too.
LIB_SRC  := $(wildcard src/*.c src/*/*.c src/models/families/*.c $(if $(KERNEL_DIR),$(KERNEL_DIR)/*.c))
ifneq ($(KERNEL_ARCH),x86)
LIB_SRC  := $(filter-out %_avx2.c %_avx512.c,$(LIB_SRC))
endif
LIB_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))
TOOL_SRC := $(wildcard tools/*.c)
TOOL_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(TOOL_SRC))
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
HDRS     := include/vitc.h $(wildcard src/*.h src/*/*.h src/kernels/*/*.h tests/*.h tools/*.h)

SONAME   := libvitc.so.$(SOVERSION)
SOFILE   := $(BUILD)/libvitc.so.$(VERSION)

.PHONY: all lib tools tests test test-c test-python demo bench bench-ort bench-train bench-finetune asan valgrind install deps deps-system \
        clean check-deps fuzz fuzz-build fuzz-bins check-optout check-generic tsan bench-text \
        bench-dense
all: lib tools

lib: $(BUILD)/libvitc.a $(BUILD)/libvitc.so
tools: $(BUILD)/vitc

ifeq ($(KERNEL_ARCH),x86)
$(BUILD)/obj/%_avx512.o: %_avx512.c $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/obj/%_avx2.o: %_avx2.c $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@
endif

# The CLI is built with mpicc and -DVITC_MPI under MPI=1 (data-parallel
# `vitc train`); the library never needs MPI. tool-flags records the choice
# so that switching MPI on or off rebuilds the tool.
ifeq ($(MPI),1)
TOOL_CC    := mpicc
TOOL_FLAGS := -DVITC_MPI
else
TOOL_CC    := $(CC)
TOOL_FLAGS :=
endif
.PHONY: FORCE
FORCE:
$(BUILD)/tool-flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(TOOL_CC) $(TOOL_FLAGS) $(SERVE_CFLAGS)' | cmp -s - $@ || echo '$(TOOL_CC) $(TOOL_FLAGS) $(SERVE_CFLAGS)' > $@

$(BUILD)/obj/tools/%.o: tools/%.c $(HDRS) $(BUILD)/tool-flags
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(TOOL_CC) $(BASE) $(CFLAGS) $(TOOL_FLAGS) $(SERVE_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) -c $< -o $@

$(BUILD)/libvitc.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SOFILE): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/libvitc.so: $(SOFILE)
	ln -sf libvitc.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# `vitc serve`'s web page (web/): its files become a C array in the vitc
# binary, so that an installed vitc serves the page with no files beside
# it. The generator is a small C program (web/embed.c) built with the host
# compiler: no xxd, no Python, and unlike `ld -r -b binary` or .incbin it
# works with every compiler and linker the tree builds with.
HOSTCC    ?= cc
WEB_FILES := $(sort $(wildcard web/*.html web/*.js web/*.css web/*.svg))
WEB_OBJ   := $(BUILD)/obj/gen/serve_assets.o

$(BUILD)/embed: web/embed.c
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(HOSTCC) -O1 -o $@ $<

# the list itself, so that a file added to or removed from web/ regenerates
$(BUILD)/web-files: FORCE
	@mkdir -p $(BUILD)
	@echo '$(WEB_FILES)' | cmp -s - $@ || echo '$(WEB_FILES)' > $@

$(BUILD)/gen/serve_assets.c: $(BUILD)/embed $(WEB_FILES) $(BUILD)/web-files
	@mkdir -p $(dir $@)
	@echo "  GEN $@"
	$(Q)$(BUILD)/embed $@ $(WEB_FILES)

$(WEB_OBJ): $(BUILD)/gen/serve_assets.c tools/serve_assets.h
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) -Itools $(CFLAGS) -c $< -o $@

# TOOL_LIB: the library the tool links (mpi-tool reuses the default build's:
# the library never needs MPI).
TOOL_LIB ?= $(BUILD)/libvitc.a
$(BUILD)/vitc: $(TOOL_OBJ) $(WEB_OBJ) $(TOOL_LIB)
	$(TOOL_CC) -o $@ $(TOOL_OBJ) $(WEB_OBJ) $(TOOL_LIB) $(LDFLAGS) $(LDLIBS) $(SERVE_LIBS)

# C tests: cmocka, one binary per file, linked statically against the library.
$(BUILD)/tests/%: tests/%.c $(BUILD)/libvitc.a $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) -Wno-unused-parameter $< -o $@ $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS) -lcmocka

# serve's queue and batcher live in the tool (tools/serve_core.c): this
# test links the tool's objects too.
$(BUILD)/tests/test_serve_core: tests/test_serve_core.c $(BUILD)/libvitc-cli.a $(BUILD)/libvitc.a $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  CC  $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) $(SERVE_CFLAGS) -Itools -Wno-unused-parameter $< -o $@ \
	  $(BUILD)/libvitc-cli.a $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS) $(SERVE_LIBS) -lcmocka

tests: $(TEST_BIN)

deps:
	@VITC_VENV=$(VENV) sh scripts/install-deps.sh
deps-system:
	@sh scripts/install-deps.sh --system

test: deps
	@$(MAKE) --no-print-directory all tests mpi-tool
	@$(MAKE) --no-print-directory test-c test-python

# The MPI tests (tests/python/test_embed_shards.py, test_train.py's TestMPI)
# run build-mpi/vitc: the tool built with MPI=1 beside the default build,
# wherever mpicc is installed. Without it they skip and say why.
HAVE_MPICC := $(shell command -v mpicc >/dev/null 2>&1 && echo 1)
.PHONY: mpi-tool
mpi-tool:
ifeq ($(HAVE_MPICC),1)
	@$(MAKE) --no-print-directory lib
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi TOOL_LIB=$(BUILD)/libvitc.a build-mpi/vitc
else
	@echo "mpicc not found: no build-mpi/vitc, the MPI tests skip (Debian: openmpi-bin libopenmpi-dev)"
endif

test-c: tests
	@sh scripts/run-tests.sh $(BUILD)/tests

test-python: lib
	PYTHONPATH=python $(PYTHON) -m unittest discover -s tests/python -t . -p 'test_*.py'

# The seed blocks, then the shipped Fashion-MNIST model (trained by `vitc
# train`, README): a grid of test images with their labels, the test-set
# accuracy, attention maps; pictures in $(BUILD)/demo.
demo: deps-system
	@$(MAKE) --no-print-directory all
	$(BUILD)/vitc demo
	$(BUILD)/vitc demo-fashion --model models/fashion-vit.safetensors --out-dir $(BUILD)/demo

# BENCH_ONLY=train (or inference, hub, engines, or workload names) runs only those rows,
# into bench/results-$(BENCH_ONLY).md so the full table is not overwritten.
comma := ,
BENCH_OUT = bench/results$(if $(BENCH_ONLY),-$(subst $(comma),-,$(BENCH_ONLY))).md
bench: deps
	@$(MAKE) --no-print-directory all $(BUILD)/bench_pingpong
	PYTHONPATH=python $(PYTHON) bench/bench.py --out $(BENCH_OUT) $(if $(BENCH_ONLY),--only $(BENCH_ONLY))
	$(if $(BENCH_ONLY),,PYTHONPATH=python $(PYTHON) bench/text.py --out bench/results-text.md)
	$(if $(BENCH_ONLY),,PYTHONPATH=python $(PYTHON) bench/dense.py --out bench/results-dense.md)

# The text side alone: CLIP's text tower against torch and ONNX Runtime,
# the tokenizer against the Rust one, zero-shot's cache (bench/text.py).
bench-text: deps
	@$(MAKE) --no-print-directory all
	PYTHONPATH=python $(PYTHON) bench/text.py --out bench/results-text.md

# The dense side alone: SAM's image encoder and one prompt, Depth Anything
# small, against torch eager and OpenVINO fp32 (bench/dense.py).
bench-dense: deps
	@$(MAKE) --no-print-directory all
	PYTHONPATH=python $(PYTHON) bench/dense.py --out bench/results-dense.md

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1" \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  LDFLAGS="-fsanitize=address,undefined" tests
	@ASAN_OPTIONS=detect_leaks=1 sh scripts/run-tests.sh build-asan/tests

# Sessions of one model in several threads, and serve's batcher with its
# clients, under ThreadSanitizer. Built without OpenBLAS, whose
# uninstrumented threads TSan cannot follow.
tsan:
	@$(MAKE) --no-print-directory BUILD=build-tsan NO_BLAS=1 OPT="-O1" \
	  CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=thread" build-tsan/tests/test_session build-tsan/tests/test_serve_core
	@TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/test_session
	@TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/test_serve_core

# The documented builds without the optional libraries, each in its own
# build-optout/ folder: every one must build under -Werror, since the code
# #ifdef'd out differs in each. The C tests run for the build without all
# four only, and only that build compiles them: the tests' own #ifdefs
# follow the same flags, so the all-off build covers their code paths, and
# building them four more times cost CI a minute and a half on 2 cores.
# There, every test that needs a missing library must skip, not fail.
# NO_TEXT (no utf8proc: no tokenizers) and NO_SERVE (no libmicrohttpd: no
# `vitc serve`) are built only in the all-off build.
OPTOUT := NO_BLAS NO_PNG NO_JPEG NO_ZLIB
check-optout:
	@for v in $(OPTOUT); do \
	  dir=build-optout/$$(echo $$v | tr 'A-Z ' 'a-z+'); \
	  echo "== $$v: $$dir (library and tool)"; \
	  $(MAKE) --no-print-directory BUILD=$$dir WERROR=1 $$v=1 all || exit 1; \
	done
	@v="$(OPTOUT) NO_TEXT NO_SERVE"; dir=build-optout/all-off; \
	  echo "== $$v: $$dir (with the C tests)"; \
	  $(MAKE) --no-print-directory BUILD=$$dir WERROR=1 $$(for f in $$v; do echo $$f=1; done) \
	    all tests || exit 1; \
	  sh scripts/run-tests.sh $$dir/tests

# What a machine without an arch folder builds (src/kernels/README.md), here.
check-generic:
	@$(MAKE) --no-print-directory BUILD=build-optout/generic KERNEL_ARCH=generic WERROR=1 all tests
	@sh scripts/run-tests.sh build-optout/generic/tests

valgrind: tests
	@VALGRIND="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite -q" \
	  sh scripts/run-tests.sh $(BUILD)/tests

# libFuzzer targets (tests/fuzz/*.c): the library and the tool's objects are
# rebuilt by clang with coverage and ASan+UBSan in build-fuzz/. The tool's
# objects go into an archive, so a harness links only what it uses; vitc.o
# is left out, its main() would clash with libFuzzer's.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_SRC     := $(wildcard tests/fuzz/*.c)
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))
FUZZ_CLI_OBJ := $(filter-out $(BUILD)/obj/tools/vitc.o,$(TOOL_OBJ))

fuzz-build:
	@$(MAKE) --no-print-directory BUILD=build-fuzz CC=$(FUZZ_CC) \
	  CFLAGS="-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link" fuzz-bins

fuzz: fuzz-build
	@sh scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

fuzz-bins: $(FUZZ_BIN)

$(BUILD)/libvitc-cli.a: $(FUZZ_CLI_OBJ) $(WEB_OBJ)
	@rm -f $@
	$(Q)ar rcs $@ $^

$(BUILD)/fuzz/%: tests/fuzz/%.c $(BUILD)/libvitc-cli.a $(BUILD)/libvitc.a $(HDRS)
	@mkdir -p $(dir $@)
	@echo "  FUZZ $@"
	$(Q)$(CC) $(BASE) $(CFLAGS) -Itools -fsanitize=fuzzer $< -o $@ $(BUILD)/libvitc-cli.a \
	  $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS) $(SERVE_LIBS)

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/vitc.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libvitc.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SOFILE) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libvitc.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libvitc.so
	install -m 755 $(BUILD)/vitc $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@LIBS@|$(LDLIBS)|g' vitc.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/vitc.pc

# build-pip/: `pip install .`'s build (setup.py); egg-info from older setuptools.
clean:
	rm -rf build build-asan build-fuzz build-pip build-optout build-mpi python/*.egg-info *.egg-info

# Attention kernel speed on the standard shapes, 1 and 2 threads
# (tests/bench_attention.c; a driver, not a test).
$(BUILD)/bench_attention: tests/bench_attention.c $(BUILD)/libvitc.a $(HDRS)
	$(Q)$(CC) $(BASE) $(CFLAGS) $< -o $@ $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS)
# The ViT-B/16 rows alone with every engine (bench/peers.py: vitc fp32,
# bf16, int8; PyTorch eager and torch.compile; ONNX Runtime; OpenVINO).
bench-ort: deps
	@$(MAKE) --no-print-directory all
	PYTHONPATH=python $(PYTHON) bench/bench.py --out bench/results-ort.md --only engines

# Fashion-MNIST training end to end against PyTorch + DataLoader, MPI
# overhead (with BENCH_MPI=1: builds build-mpi/vitc with MPI=1) and time to
# 90%, into bench/results-train-e2e.md (bench/train_e2e.py).
BENCH_IMAGES ?= 12800
bench-train: deps
	@$(MAKE) --no-print-directory all
	$(if $(BENCH_MPI),@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi tools)
	PYTHONPATH=python $(PYTHON) bench/train_e2e.py --images $(BENCH_IMAGES) \
	  --log90 docs/fashion-train-epochs.jsonl --out bench/results-train-e2e.md \
	  $(if $(BENCH_MPI),--mpi-vitc build-mpi/vitc)

# Fine-tuning learns: random-init DINOv2-S and CLIP-B Hub directories
# trained by `vitc train --init` on photos, into bench/results-finetune.md
# (bench/finetune_learn.py).
bench-finetune: deps
	@$(MAKE) --no-print-directory all
	PYTHONPATH=python $(PYTHON) bench/finetune_learn.py --out bench/results-finetune.md

# The round trip of a cache line between CPUs 0 and 1 (tests/bench_pingpong.c):
# where a VM's two vCPUs sit right now.
$(BUILD)/bench_pingpong: tests/bench_pingpong.c
	$(Q)$(CC) $(BASE) $(CFLAGS) $< -o $@ -pthread

bench-attention: $(BUILD)/bench_attention
	$(BUILD)/bench_attention -t 1 && $(BUILD)/bench_attention -t 2

# GEMM backends side by side at ViT-B shapes (tests/bench_gemm.c, not a test).
.PHONY: bench-gemm
$(BUILD)/bench_gemm: tests/bench_gemm.c $(BUILD)/libvitc.a $(HDRS)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS)
bench-gemm: $(BUILD)/bench_gemm
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_gemm
# A ViT-B block's four products in one precision (tests/bench_gemm_lp.c).
$(BUILD)/bench_gemm_lp: tests/bench_gemm_lp.c $(BUILD)/libvitc.a $(HDRS)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(BUILD)/libvitc.a $(LDFLAGS) $(LDLIBS)
# The bf16 / int8 ViT-B/16 forward's per-stage profile and its bound on the
# fraction of peak (docs/precision.md), batch 1 and 8, 1 thread (CPU time)
# and 2 (wall time: meaningful on a quiet machine only).
.PHONY: bench-gemm-lp bench-lowp
bench-gemm-lp: $(BUILD)/bench_gemm_lp
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_gemm_lp 9 2 1576 bf16
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_gemm_lp 9 2 1576 int8
bench-lowp: $(BUILD)/bench_gemm_lp
	for t in 1 2; do for p in bf16 int8; do for b in 1 8; do \
	  OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_gemm_lp --bound 7 $$t $$b $$p fp32 || exit 1; done; done; done
