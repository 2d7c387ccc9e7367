#!/usr/bin/env bash
# Configures the clang build that tests/sanitize.sh and tests/fuzz/run_fuzz.sh share: ASan +
# UBSan everywhere (any report fails), the CUDA kernels on the emulated device, engine/
# instrumented for libFuzzer (BELAY_FUZZ_INSTRUMENT), the GPU path measured for line coverage
# (BELAY_EMU_LINE_COVERAGE). One place, so that the two scripts can
# never configure the same directory with different flags (and rebuild it from scratch).
#   usage: tests/configure_san.sh ROOT BUILD_DIR
set -euo pipefail
root=$1
build=$2
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# -gline-tables-only: the file and line in every report, without the full debug information
# that costs this build a tenth of its compile time and more of its link time.
# BELAY_EMU_SEEDS: the GPU suite runs under seed 1 here; seeds 2 and 3 run in the plain
# emulated Release build (tests/emulation/plain_release.sh), where they take a third the time;
# so do the planted bugs that need no sanitizer to be caught (BELAY_EMU_PLANTED=asan here).
# BELAY_APPS_OPT=-O0, BELAY_DRIVER_TESTS_OPT=-O0: apps/ and the test files outside tests/kernels,
# whose own code is not where the run's time goes, at -O0: ASan + UBSan's code at -O2 (-O1 for
# tests) was most of their compile time (apps/ 357 s of CPU at -O2, 125 s at -O0).
# BELAY_EMU_TENSOR_CORE_OPT=-O1: the tensor-core units (the GEMM's and attention's forward),
# the longest compiles here, a third shorter (measured on the GEMM's: 174 s -> 118 s of CPU
# under load).
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBELAY_ENABLE_CUDA=OFF -DBELAY_CUDA_EMULATION=ON -DBELAY_BUILD_BENCH=OFF -DBELAY_FUZZ_INSTRUMENT=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DBELAY_EMU_TENSOR_CORE_OPT=-O1 -DBELAY_APPS_OPT=-O0 -DBELAY_DRIVER_TESTS_OPT=-O0 \
  -DBELAY_EMU_SEEDS=1 -DBELAY_EMU_PLANTED=asan -DBELAY_EMU_LINE_COVERAGE=ON \
  -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" >/dev/null
