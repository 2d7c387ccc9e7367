#!/usr/bin/env bash
# Checks the dependency arrows of docs/design.md by the includes each room makes:
#   apps -> amp -> optim -> engine <- kernels; amp -> autograd -> engine;
#   autograd may read amp/autocast.h and nothing else of amp, and amp/autocast.{h,cpp} stay a
#   leaf that includes nothing of belay but engine/ (docs/layout.md says why that door stays);
#   amp/dist (the gradient communicators) is used by amp and uses only engine and autograd;
#   apps/text (the BPE tokenizer) uses engine alone; apps/run (the training library) uses
#   apps/text and no other room of apps; apps/cli uses apps/run, apps/text and apps/plot;
#   apps/plot stands alone; apps/python (the module) uses apps/run and apps/text, never the CLI.
# tests/layering_self_test.sh plants wrong includes in a copy of the tree and checks that this
# script catches each.
#   usage: tests/layering_test.sh [ROOT]
set -u
root=${1:-.}
fail=0
# label (the room), allowed include prefixes (regex), files: each quoted include of a file
# must name a header directly inside an allowed folder.
check_includes() {
  local room=$1 allowed=$2
  shift 2
  [ $# -gt 0 ] || return 0
  while IFS= read -r line; do
    [[ "${line#*:}" =~ \#include\ \"([^\"]+)\" ]] || continue
    inc=${BASH_REMATCH[1]}
    [[ "$inc" == */* ]] || continue
    file=${line%%:*}
    [ "$root/$inc" = "${file%.*}.h" ] && continue  # a source file's own header
    if ! [[ "$inc" =~ ^($allowed)/[^/]+$ ]] && [[ "$inc" != "amp/autocast.h" || "$room" != "autograd" ]]; then
      echo "layering: $file includes $inc ($room may use: $allowed)"
      fail=1
    fi
  done < <(grep -Hn '#include "' "$@" 2>/dev/null)
}
check() {  # room (a folder; its sub-rooms are checked on their own), allowed include prefixes (regex)
  local files=()
  mapfile -t files < <(find "$root/$1" -maxdepth 1 -type f \
                         \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
  check_includes "$1" "$2" "${files[@]}"
}
check engine 'engine'
check kernels "engine|kernels|kernels/[a-z_/]+"
for k in "$root"/kernels/*/ "$root"/kernels/*/*/; do
  [ -d "$k" ] && check "${k#"$root"/}" "engine|kernels|kernels/[a-z_/]+"
done
check autograd 'engine|autograd'
# The door autograd uses stays a leaf: through it autograd reaches nothing but engine/.
check_includes amp/autocast 'engine' "$root/amp/autocast.h" "$root/amp/autocast.cpp"
check optim 'engine|autograd|optim'
check amp/dist 'engine|autograd|amp/dist'
check amp 'engine|autograd|optim|amp|amp/dist'
core='engine|autograd|optim|amp|amp/dist'
check apps/text 'engine|apps/text'
check apps/run "$core|apps/text|apps/run"
check apps/plot "$core|apps/plot"
check apps/cli "$core|apps/text|apps/run|apps/plot|apps/cli"
check apps/python "$core|apps/text|apps/run|apps/python"
# Every folder of apps/ and amp/ is a room above: a new one must be given its arrows here.
for d in "$root"/apps/*/ "$root"/amp/*/; do
  d=${d#"$root"/}; d=${d%/}
  case "$d" in apps/text|apps/run|apps/plot|apps/cli|apps/python|amp/dist) ;;
    apps/data) ;;  # scripts that make data files (Python, standard library): no includes
    apps/python/*) ;;
    *) echo "layering: $d has no arrows in tests/layering_test.sh"; fail=1 ;;
  esac
done
[ $fail -eq 0 ] && echo "layering: all rooms respect the arrows"
exit $fail
