#!/usr/bin/env bash
# The CPU test suite again, built with clang under AddressSanitizer and UndefinedBehavior-
# Sanitizer (any report fails the run), CUDA off. The build directory and flags are those of
# tests/fuzz/run_fuzz.sh (coverage instrumentation included), so one clang build serves both.
#   usage: tests/sanitize.sh            env: BELAY_SAN_BUILD_DIR (default build-san)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_SAN_BUILD_DIR:-$root/build-san}
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBELAY_ENABLE_CUDA=OFF -DBELAY_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $sanitizers" -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" >/dev/null
cmake --build "$build" -j"$(nproc)" --target belay belay_tests belay_gemm_warps4_tests write_sample_safetensors
cd "$build"
# detect_leaks: a leak is a bug too (the allocator singletons are leaked on purpose but stay
# reachable, so LeakSanitizer does not report them).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j"$(nproc)" -LE gpu
