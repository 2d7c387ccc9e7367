#!/usr/bin/env bash
# Builds the Python module against an installed belay and runs its tests, in a virtual
# environment under the build directory (third_party/install_deps.sh --python-venv makes it;
# the interpreter's own site-packages are never touched). The module's CMake build directory
# is kept there too, so a rerun recompiles only what changed.
#   usage: tests/apps/python/run.sh <build dir> <belay install prefix>
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
build=$(cd "$1" && pwd)
prefix=$(cd "$2" && pwd)
venv=$build/pyenv
bash "$root/third_party/install_deps.sh" --python-venv "$venv"
# --no-build-isolation: the build uses the venv's scikit-build-core and pybind11 (no download).
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
    -Cbuild-dir="$build/python-module" -Ccmake.define.belay_DIR="$prefix/lib/cmake/belay" \
    "$root/apps/python" >"$build/python-module.log" 2>&1; then
  grep -E "error|Error" "$build/python-module.log" | head -30 >&2
  echo "building the Python module failed, see $build/python-module.log" >&2
  exit 1
fi
"$venv/bin/python" -c 'import belay, sys; print("python module: belay", belay.__version__, "for python", sys.version.split()[0])'
# -rs: skip reasons shown (the PyTorch parity test skips without torch); -p no:cacheprovider:
# pytest writes nothing into the source tree.
cd "$build" && "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/tests/apps/python"
