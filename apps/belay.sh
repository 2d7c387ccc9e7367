#!/usr/bin/env bash
# The one command that runs belay on a fresh Debian 12 machine: installs what is missing,
# configures and builds (Release, CUDA when nvcc is found), then runs `belay "$@"`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BELAY_BUILD_DIR:-$root/build}
bash "$root/third_party/install_deps.sh"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target belay belay_text_corpus -j"$(nproc)" >/dev/null
exec "$build/belay" "$@"
