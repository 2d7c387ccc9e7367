#!/usr/bin/env bash
# tests/layering_test.sh must catch a wrong arrow, not only pass: on a copy of the tree's
# sources it passes, then each planted include below (one at a time, each against an arrow of
# docs/design.md) must make it fail and name the file that broke the arrow.
#   usage: tests/layering_self_test.sh ROOT
set -u
root=$(cd "${1:?usage: $0 ROOT}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The rooms' sources, as the layering test sees them (it reads only includes).
(cd "$root" && find engine kernels autograd optim amp apps -type f \
   \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
   xargs -0 cp --parents -t "$tmp")
fail=0
if ! out=$(bash "$root/tests/layering_test.sh" "$tmp"); then
  echo "layering_self_test: the copy of the tree fails already:"; echo "$out"; exit 1
fi
# file that gets the include, the include: each breaks one arrow.
plants=(
  "engine/tensor.h autograd/graph.h"          # engine uses nothing else
  "kernels/cpu/cpu_gemm.cpp autograd/ops.h"   # kernels see only engine
  "autograd/ops.cpp amp/grad_scaler.h"        # autograd reads amp/autocast.h only
  "amp/autocast.h amp/step_log.h"             # the door autograd uses stays a leaf
  "amp/autocast.cpp optim/optimizer.h"
  "optim/adamw.cpp amp/clip.h"                # optim is below amp
  "amp/dist/communicator.cpp optim/optimizer.h"
  "apps/run/dataset.cpp apps/cli/cli.h"       # the library uses no other room of apps
  "apps/text/bpe.cpp apps/run/dataset.h"      # the tokenizer stands on engine alone
  "apps/text/pretokenize.cpp autograd/ops.h"
  "apps/python/bindings.cpp apps/cli/cli.h"   # the module never uses the CLI
)
for p in "${plants[@]}"; do
  read -r file inc <<<"$p"
  if [ ! -f "$tmp/$file" ]; then
    echo "layering_self_test: $file is gone: plant the include in another file of its room"
    fail=1
    continue
  fi
  cp "$tmp/$file" "$tmp/$file.orig"
  printf '#include "%s"\n' "$inc" >>"$tmp/$file"
  if out=$(bash "$root/tests/layering_test.sh" "$tmp"); then
    echo "layering_self_test: MISSED $file including $inc"
    fail=1
  elif ! grep -q "layering: $tmp/$file includes $inc" <<<"$out"; then
    echo "layering_self_test: $file including $inc failed, but the report does not name it:"
    echo "$out"
    fail=1
  fi
  mv "$tmp/$file.orig" "$tmp/$file"
done
[ $fail -eq 0 ] && echo "layering_self_test: all ${#plants[@]} planted arrows caught"
exit $fail
