#!/usr/bin/env bash
# Peak RSS of a GPT-2-small-shaped training step (12 layers, width 768, 12 heads, batch 4, vocab
# 256: belay's byte tokens) at several contexts: belay with --attention fused and naive, and
# PyTorch (bench/peers/torch_gpt_memory.py, SDPA) when its venv exists. One process per row
# (peak RSS is per process); 2 AdamW steps each. By hand, never in CI: a row at context 1024
# takes minutes on 2 cores.
#   bench/gpt_memory.sh BUILD_DIR [CONTEXTS...]      (default contexts: 256 512 1024 2048)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "$1" && pwd); shift
if [ $# -gt 0 ]; then contexts=("$@"); else contexts=(256 512 1024 2048); fi
venv="${BELAY_TORCH_VENV:-$root/../venv-torch}"
data="$build/data/text.safetensors"
[ -f "$data" ] || { echo "gpt_memory: no $data (ninja -C $build belay_text_corpus)" >&2; exit 2; }
echo "| context | belay fused | belay naive | PyTorch (SDPA) |"
echo "|---|---|---|---|"
rss() { /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1; }
for t in "${contexts[@]}"; do
  row="| $t |"
  for a in fused naive; do
    if [ "$a" = naive ] && [ "$t" -gt 1024 ]; then row+=" (not run: T^2 scores) |"; continue; fi
    kb=$(rss "$build/belay" train --model gpt --data "$data" --layers 12 --width 768 --heads 12 --context "$t" \
         --batch 4 --steps 2 --eval-every 0 --attention "$a" --quiet)
    row+=" $(awk -v k="$kb" 'BEGIN{printf "%.2f GB", k/1048576}') |"
  done
  if [ -x "$venv/bin/python" ]; then
    kb=$("$venv/bin/python" "$root/bench/peers/torch_gpt_memory.py" --context "$t" | awk '{print $2}')
    row+=" $(awk -v k="$kb" 'BEGIN{printf "%.2f GB", k/1048576}') |"
  else
    row+=" (no venv) |"
  fi
  echo "$row"
done
