#!/usr/bin/env bash
# The plain emulated build: clang, Release, no sanitizers, the emulator's shared-memory race
# check included (clang's load/store hooks need no sanitizer runtime; simt.cpp supplies the
# one symbol they ask for). The configuration a developer iterates with, checked to build and
# pass: only the targets the emulated suite needs, then the GPU suite (tests/gpu/) under the
# scheduler seeds the sanitizer pass leaves to it and the planted bugs that need no sanitizer
# to be caught (BELAY_EMU_PLANTED=plain: a wrong result, the race check, an emulator fault, the
# memory metrics; a mutant compiles here in about half its time under ASan). tests/run.sh
# runs it with seeds 2 and 3: the sanitizer pass (tests/sanitize.sh) runs seed 1, the
# ASan-only planted bugs and everything else (the emulator's own tests emu.simt.* and
# `belay train --device cuda`, emu.train_cli, which depend on no seed, run there only), and
# the same seeds under ASan cost three times as much. -O2: the emulated suite runs as fast as
# at Release's -O3, and the build takes less; apps/ (the training library the GPU suite's runs
# use) at -O0, as in the sanitizer build: its loops call the emulated kernels.
#   usage: tests/emulation/plain_release.sh <root> <build-dir>
#   env:   BELAY_EMU_SEEDS_PLAIN (default "2 3"): the seeds; CMAKE_CXX_COMPILER_LAUNCHER
#          (e.g. ccache) is read by CMake itself.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 <root> <build-dir>" >&2
  exit 2
fi
root=$(cd "$1" && pwd)
build=$2
seeds=${BELAY_EMU_SEEDS_PLAIN:-2 3}
jobs=$(nproc)
start=$(date +%s)
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DBELAY_ENABLE_CUDA=OFF -DBELAY_CUDA_EMULATION=ON -DBELAY_BUILD_BENCH=OFF \
  -DBELAY_APPS_OPT=-O0 -DBELAY_EMU_SEEDS="${seeds// /;}" -DBELAY_EMU_PLANTED=plain >/dev/null
cmake --build "$build" -j"$jobs" --target belay_gpu_tests belay_planted_bugs
built=$(date +%s)
cd "$build"
rm -f emulated-kernels.log
status=0
ctest -j"$jobs" --output-on-failure -R "^(emu\.seed(${seeds// /|})\.|planted_bugs$)" || status=$?
done_at=$(date +%s)
echo "plain emulated Release: configure+build $((built - start)) s, tests $((done_at - built)) s," \
     "total $((done_at - start)) s (seeds $seeds, $jobs jobs)"
exit $status
