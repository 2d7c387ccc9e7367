#!/usr/bin/env bash
# Installs what belay needs from Debian 12's packages, only what is missing.
# The toolchain (g++, cmake, ninja) is assumed; nvcc is optional (CPU-only build without it).
set -euo pipefail
packages=(libeigen3-dev catch2 libcli11-dev nlohmann-json3-dev ninja-build cmake g++)
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
