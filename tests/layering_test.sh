#!/usr/bin/env bash
# Checks the dependency arrows of DESIGN.md by the includes each room makes:
#   apps -> amp -> optim -> engine <- kernels; amp -> autograd -> engine;
#   autograd may read amp/autocast.h (a leaf) and nothing else of amp.
set -u
root=${1:-.}
fail=0
check() {  # room, allowed rooms (regex)
  local room=$1 allowed=$2
  while IFS= read -r line; do
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
    dir=${inc%%/*}
    [[ "$inc" == */* ]] || continue
    if ! [[ "$dir" =~ ^($allowed)$ ]] && [[ "$inc" != "amp/autocast.h" || "$room" != "autograd" ]]; then
      echo "layering: ${line%%:*} includes $inc ($room may use: $allowed)"
      fail=1
    fi
  done < <(grep -rn '#include "' "$root/$room" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' 2>/dev/null)
}
check engine 'engine'
check kernels 'engine|kernels'
check autograd 'engine|autograd'
check optim 'engine|autograd|optim'
check amp 'engine|autograd|optim|amp'
check apps 'engine|autograd|optim|amp|apps'
[ $fail -eq 0 ] && echo "layering: all rooms respect the arrows"
exit $fail
