#!/usr/bin/env bash
# Installs what belay needs from Debian 12's packages, only what is missing.
#   usage: install_deps.sh [--tests]   (--tests: also what the test command needs)
# The toolchain (g++, cmake, ninja) is assumed; nvcc is optional (CPU-only build without it).
set -euo pipefail
# librsvg2-bin: rsvg-convert, which `belay plot -o FILE.png` runs (and the tests use to check SVGs).
# openmpi: `belay train --dist mpi` and its tests (the build without it works, CPU single-process).
packages=(libeigen3-dev catch2 libcli11-dev nlohmann-json3-dev ninja-build cmake g++ python3 librsvg2-bin
  openmpi-bin libopenmpi-dev)
# The test command also builds with clang under ASan/UBSan and runs the libFuzzer target.
[ "${1:-}" = "--tests" ] && packages+=(clang libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "belay: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
