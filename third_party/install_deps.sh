#!/usr/bin/env bash
# Installs what belay needs from Debian 12's packages, only what is missing.
#   usage: install_deps.sh [--tests]        (--tests: also what the test command needs)
#          install_deps.sh --python-venv DIR
# The toolchain (g++, cmake, ninja) is assumed; nvcc is optional (CPU-only build without it).
# --python-venv: a virtual environment at DIR (made if missing, from the python3 on PATH,
# which may be Debian's or another such as pyenv's) with what building and testing the
# Python module needs from PyPI. Nothing is installed outside DIR.
set -euo pipefail
if [ "${1:-}" = "--python-venv" ]; then
  venv=${2:?usage: install_deps.sh --python-venv DIR}
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || { echo "belay: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  fi
  # Headers to compile against: Debian's python3 needs python3-dev (--tests installs it).
  inc=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$inc/Python.h" ] || { echo "belay: no Python.h in $inc (Debian: apt-get install python3-dev)" >&2; exit 1; }
  # Satisfied requirements are not fetched again: a second run needs no network.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "scikit-build-core>=0.8" "pybind11>=2.10" "numpy>=1.21" "pytest>=7" "ml_dtypes>=0.2"
  exit 0
fi
# librsvg2-bin: rsvg-convert, which `belay plot -o FILE.png` runs (and the tests use to check SVGs).
# openmpi: `belay train --dist mpi` and its tests (the build without it works, CPU single-process).
# libpython3.11-minimal and -stdlib: their .py sources are the GPT's text corpus (apps/data/make_text_corpus.py).
# libpcre2-dev: the regular expressions of GPT-2's BPE pre-tokenizer (apps/text/).
packages=(libeigen3-dev catch2 libcli11-dev nlohmann-json3-dev ninja-build cmake g++ python3 python3-venv python3-dev
  librsvg2-bin openmpi-bin libopenmpi-dev libpython3.11-minimal libpython3.11-stdlib libpcre2-dev)
# The test command also builds with clang under ASan/UBSan and runs the libFuzzer target; ps
# (procps) finds the processes of the build it runs in the background, to stop them early.
[ "${1:-}" = "--tests" ] && packages+=(clang libclang-rt-14-dev libomp-14-dev procps)
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
