#!/usr/bin/env bash
# The one command that tests belay on a fresh Debian 12 machine: installs what is missing,
# then
#   1. configures and builds everything (CUDA kernels too when nvcc is found; the ptxas
#      register/spill report lands in build/build.log) and runs every test (GPU tests are
#      skipped cleanly where there is no GPU); installs belay into a fresh prefix, builds a
#      consumer project and the Python module against it and runs the Python tests;
#   2. everything again under ASan + UBSan (clang) with the CUDA kernels run on the CPU by
#      the SIMT emulator: the GPU suite under scheduler seed 1, train --device cuda, --dist
#      nccl on 2 ranks, the planted bugs only ASan sees, "emulated kernels: N of M ran" and
#      "GPU path: N of M lines executed" (tests/sanitize.sh);
#   3. the plain emulated Release build (no sanitizers, the race check on): the GPU suite
#      under seeds 2 and 3 and the other planted bugs (tests/emulation/plain_release.sh),
#      run beside 1 and 2 at the lowest CPU priority, its log printed at the end;
#   4. the safetensors reader under libFuzzer for a bounded run, tests/fuzz/run_fuzz.sh.
#   usage: tests/run.sh [--quick]     (--quick: step 1 only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_BUILD_DIR:-$root/build}
quick=0
[ "${1:-}" = "--quick" ] && quick=1
bash "$root/third_party/install_deps.sh" --tests
# OpenMP threads sleep instead of spinning between parallel regions: several test processes
# share two cores here, and spinning would only slow them all down.
export OMP_WAIT_POLICY=passive

# Step 3, the plain emulated build, shares nothing with steps 1 and 2 but the sources: it starts
# now, beside them, at the lowest CPU priority (nice 19), so it takes only the CPU they leave
# idle (test phases waiting on mpirun, single-threaded links, configures and scripts) and
# finishes alone after step 2. Not in a session of its own: the kernel's autogroups would give
# a new session half the CPU whatever its nice value. If this script stops early, its
# processes are stopped too (kill_tree).
kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
emu_build=${BELAY_EMU_BUILD_DIR:-$root/build-emu}
emu_pid=
if [ $quick -eq 0 ]; then
  mkdir -p "$emu_build"
  nice -n 19 bash "$root/tests/emulation/plain_release.sh" "$root" "$emu_build" >"$emu_build/plain.log" 2>&1 &
  emu_pid=$!
  trap '[ -z "$emu_pid" ] || kill_tree "$emu_pid"' EXIT
fi

echo "== build and test ($build)"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
if ! cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1; then
  grep -E "error|FAILED" "$build/build.log" | head -40 >&2
  echo "build failed, see $build/build.log" >&2
  exit 1
fi
echo "build: ${SECONDS} s"
# The ptxas report: every kernel built for sm_80 and sm_90, no spill in the GEMM and
# optimizer kernels (the table: $build/ptxas-report.txt). A build that recompiled no CUDA
# file has no report to check.
if grep -q "Compiling entry function" "$build/build.log"; then
  bash "$root/tests/kernels/check_ptxas.sh" "$build/build.log" "$build/ptxas-report.txt"
else
  echo "ptxas: no CUDA file compiled in this build, nothing to check"
fi
(cd "$build" && ctest --output-on-failure -j"$(nproc)")
# The whole suite again with the CPU kernels forced onto the baseline (SSE2) path: the path
# every x86-64 CPU can run must stay correct whatever the widest one here is.
# Left out, as once is enough: the checks that run no CPU kernel of their own (the test names, the layering,
# the objects' ISAs, the ptxas and bench report scripts, the GPU-check rehearsal, the
# safetensors sample, the text corpus, the CLI's exit codes and messages) and dist_mpi and
# dist_zero (their ranks run the kernels the single-process cases run here; what they add is
# MPI's transport and the sharded step, and dist_mpi is the longest test of the suite).
echo "== the whole suite on the baseline CPU path (BELAY_CPU_ISA=baseline)"
no_kernel='^(gpu_check_rehearsal|test_names|gpu_test_names|layering|layering_self_test|isa_objects|isa_objects_bench|ptxas_check|bench_expected_column'
no_kernel+='|safetensors_write_sample|safetensors_independent_check|text_corpus|cli_behaviour|dist_mpi|dist_zero)$'
(cd "$build" && BELAY_CPU_ISA=baseline ctest --output-on-failure -j"$(nproc)" -E "$no_kernel")

# belay as a package: installed into a prefix made afresh under the build directory, a
# consumer project built against that prefix alone, then the Python module built against
# the same prefix (no second compile of belay) and its pytest tests.
echo "== install, consumer, Python module"
bash "$root/tests/install/check_install.sh" "$build" "$build/install-check"
bash "$root/tests/apps/python/run.sh" "$build" "$build/install-check/prefix"
echo "package checks done at ${SECONDS} s"
[ $quick -eq 1 ] && exit 0

echo "tests done at ${SECONDS} s"
echo "== ASan + UBSan, the CUDA kernels on the emulated device"
bash "$root/tests/sanitize.sh"
echo "sanitizer pass done at ${SECONDS} s"

echo "== fuzzing the safetensors reader"
bash "$root/tests/fuzz/run_fuzz.sh" 200000 30

echo "== the plain emulated Release build: the GPU suite under seeds 2 and 3 (started at the beginning)"
emu_status=0
wait "$emu_pid" || emu_status=$?
emu_pid=
cat "$emu_build/plain.log"
echo "plain emulated build waited for until ${SECONDS} s"
if [ $emu_status -ne 0 ]; then
  echo "the plain emulated build failed (exit $emu_status), see $emu_build/plain.log" >&2
  exit 1
fi
echo "all done in ${SECONDS} s"
