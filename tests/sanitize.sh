#!/usr/bin/env bash
# The test suite again, built with clang under AddressSanitizer and UndefinedBehaviorSanitizer
# (any report fails the run), with the CUDA kernels on the emulated device
# (BELAY_CUDA_EMULATION: kernels/cuda compiled for the host and run by the SIMT emulator,
# kernels/cuda/emulation/). So this one build runs:
#   - the CPU suite;
#   - the GPU suite (tests/gpu/) on the emulated device under each scheduler seed, with the
#     shared-memory race check on (clang's load/store hooks), `belay train --device cuda`
#     end to end, and planted_bugs (each known bug planted in a copy of the kernels is caught);
#   - then the coverage line: every __global__ kernel of kernels/cuda/ must have run;
#   - and the GPU path's line coverage (BELAY_EMU_LINE_COVERAGE; tests/emulation/line_coverage.sh):
#     "GPU path: N of M lines executed", the lines left in build-san/gpu-path-uncovered.txt
#     (docs/gpu-path-uncovered.md says why each kind is left).
# The build directory and flags are those of tests/fuzz/run_fuzz.sh (coverage
# instrumentation included), so one clang build serves both.
#   usage: tests/sanitize.sh            env: BELAY_SAN_BUILD_DIR (default build-san)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_SAN_BUILD_DIR:-$root/build-san}
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBELAY_ENABLE_CUDA=OFF -DBELAY_CUDA_EMULATION=ON -DBELAY_BUILD_BENCH=OFF -DBELAY_EMU_LINE_COVERAGE=ON \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $sanitizers" -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
rm -rf emulated-kernels.log profraw profraw-planted
# detect_leaks: a leak is a bug too (the allocator singletons are leaked on purpose but stay
# reachable, so LeakSanitizer does not report them).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j"$(nproc)"
bash "$root/tests/emulation/kernel_coverage.sh" "$root" emulated-kernels.log emulated-kernels.txt
bash "$root/tests/emulation/line_coverage.sh" "$build" "$root"
