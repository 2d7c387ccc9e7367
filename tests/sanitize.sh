#!/usr/bin/env bash
# The test suite again, built with clang under AddressSanitizer and UndefinedBehaviorSanitizer
# (any report fails the run), with the CUDA kernels on the emulated device
# (BELAY_CUDA_EMULATION: kernels/cuda compiled for the host and run by the SIMT emulator,
# kernels/cuda/emulation/). So this one build runs:
#   - the CPU suite;
#   - the GPU suite (tests/gpu/) on the emulated device under scheduler seed 1 (seeds 2 and 3
#     run in the plain emulated build, tests/emulation/plain_release.sh, at a third of the
#     cost), with the shared-memory race check on (clang's load/store hooks), `belay train
#     --device cuda` end to end, `--dist nccl` on 2 ranks (emu.dist_nccl), and planted_bugs
#     for the bugs only AddressSanitizer sees (the others are built and caught in the plain
#     emulated build, tests/emulation/plain_release.sh);
#   - then the memory-traffic table emu.memory_metrics wrote (bank conflicts, sectors);
#   - the coverage line: every __global__ kernel of kernels/cuda/ must have run;
#   - and the GPU path's line coverage (BELAY_EMU_LINE_COVERAGE; tests/emulation/line_coverage.sh):
#     "GPU path: N of M lines executed", the lines left in build-san/gpu-path-uncovered.txt
#     (docs/gpu-path-uncovered.md says why each kind is left).
# The build directory and flags (tests/configure_san.sh) are those of tests/fuzz/run_fuzz.sh,
# so one clang build serves both.
#   usage: tests/sanitize.sh            env: BELAY_SAN_BUILD_DIR (default build-san)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_SAN_BUILD_DIR:-$root/build-san}
bash "$root/tests/configure_san.sh" "$root" "$build"
cmake --build "$build" -j"$(nproc)"
cd "$build"
rm -rf emulated-kernels.log profraw profraw-planted
# The checks that run no program of belay's (scripts over the sources, objects and reports)
# run once, in the first build of tests/run.sh; not again here.
scripts_only='^(layering|isa_objects|isa_objects_bench|ptxas_check|bench_expected_column)$'
# detect_leaks: a leak is a bug too (the allocator singletons are leaked on purpose but stay
# reachable, so LeakSanitizer does not report them).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j"$(nproc)" -E "$scripts_only"
# The table emu.memory_metrics wrote: per kernel and access site, bank conflicts and sectors.
echo "== each kernel's memory traffic, as Nsight Compute counts it (emulated-kernel-metrics.txt)"
cat emulated-kernel-metrics.txt
bash "$root/tests/emulation/kernel_coverage.sh" "$root" emulated-kernels.log emulated-kernels.txt
bash "$root/tests/emulation/line_coverage.sh" "$build" "$root"
