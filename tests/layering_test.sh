#!/usr/bin/env bash
# Checks the dependency arrows of DESIGN.md by the includes each room makes:
#   apps -> amp -> optim -> engine <- kernels; amp -> autograd -> engine;
#   autograd may read amp/autocast.h (a leaf) and nothing else of amp;
#   amp/dist (the gradient communicators) is used by amp and uses only engine and autograd;
#   apps/run (the training library) uses no other room of apps; apps/cli uses apps/run and
#   apps/plot; apps/plot stands alone; apps/python (the module) uses apps/run, never the CLI.
set -u
root=${1:-.}
fail=0
check() {  # room (a folder; its sub-rooms are checked on their own), allowed include prefixes (regex)
  local room=$1 allowed=$2
  while IFS= read -r line; do
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
    [[ "$inc" == */* ]] || continue
    if ! [[ "$inc" =~ ^($allowed)/[^/]+$ ]] && [[ "$inc" != "amp/autocast.h" || "$room" != "autograd" ]]; then
      echo "layering: ${line%%:*} includes $inc ($room may use: $allowed)"
      fail=1
    fi
  done < <(find "$root/$room" -maxdepth 1 -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
             -exec grep -Hn '#include "' {} + 2>/dev/null)
}
lower='engine|engine/[a-z_]+'
check engine 'engine'
check kernels "engine|kernels|kernels/[a-z_/]+"
for k in "$root"/kernels/*/ "$root"/kernels/*/*/; do
  [ -d "$k" ] && check "${k#"$root"/}" "engine|kernels|kernels/[a-z_/]+"
done
check autograd 'engine|autograd'
check optim 'engine|autograd|optim'
check amp/dist 'engine|autograd|amp/dist'
check amp 'engine|autograd|optim|amp|amp/dist'
core='engine|autograd|optim|amp|amp/dist'
check apps/run "$core|apps/run"
check apps/plot "$core|apps/plot"
check apps/cli "$core|apps/run|apps/plot|apps/cli"
check apps/python "$core|apps/run|apps/python"
# Every folder of apps/ and amp/ is a room above: a new one must be given its arrows here.
for d in "$root"/apps/*/ "$root"/amp/*/; do
  d=${d#"$root"/}; d=${d%/}
  case "$d" in apps/run|apps/plot|apps/cli|apps/python|amp/dist) ;;
    apps/data) ;;  # scripts that make data files (Python, standard library): no includes
    apps/python/*) ;;
    *) echo "layering: $d has no arrows in tests/layering_test.sh"; fail=1 ;;
  esac
done
[ $fail -eq 0 ] && echo "layering: all rooms respect the arrows"
exit $fail
