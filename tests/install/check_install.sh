#!/usr/bin/env bash
# belay as a package: installs the build tree into a fresh temporary prefix, then configures
# and builds tests/install/consumer against that prefix alone and runs it (FP16 training
# whose loss must fall). Also checks that nothing installed points back into the source or
# build tree (a package must work after both are gone).
#   usage: check_install.sh <build dir> [<work dir>]    (work dir: kept for the Python module)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "$1" && pwd)
work=${2:-$(mktemp -d)}
prefix=$work/prefix
mkdir -p "$work"
rm -rf "$prefix" "$work/consumer-build"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
echo "installed into $prefix: $(find "$prefix" -type f | wc -l) files"
for f in belayConfig.cmake belayConfigVersion.cmake belayTargets.cmake; do
  [ -f "$prefix/lib/cmake/belay/$f" ] || { echo "check_install: $f missing from $prefix/lib/cmake/belay" >&2; exit 1; }
done
if grep -rlF -e "$root" -e "$build" "$prefix/lib/cmake/belay"; then
  echo "check_install: the installed config names the source or build tree (above)" >&2
  exit 1
fi
# Only the prefix is given: no include path or library of the source tree can leak in.
cmake -S "$root/tests/install/consumer" -B "$work/consumer-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer-configure.log"
cmake --build "$work/consumer-build" >"$work/consumer-build.log" 2>&1 ||
  { tail -30 "$work/consumer-build.log" >&2; exit 1; }
"$work/consumer-build/consumer"
