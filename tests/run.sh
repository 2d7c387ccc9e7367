#!/usr/bin/env bash
# The one command that tests belay on a fresh Debian 12 machine: installs what is missing,
# configures and builds everything (CUDA kernels too when nvcc is found), runs every test.
# GPU tests are skipped cleanly where there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_BUILD_DIR:-$root/build}
bash "$root/third_party/install_deps.sh"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)" 2>&1 | tee "$build/build.log" | grep -vE "^ptxas info|^\[" || true
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "build failed, see $build/build.log" >&2; exit 1; }
cd "$build"
ctest --output-on-failure -j"$(nproc)" "$@"
