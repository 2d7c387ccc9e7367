#!/usr/bin/env bash
# Sharded optimizer state (--shard-optimizer, ZeRO stage 1) against the unsharded run: per
# rank the bytes of AdamW's moments and the peak RSS, at 1, 2 and 4 MPI ranks, for a
# GPT-2-small-shaped model (12 layers, width 768, 12 heads; vocab 256, belay's byte tokens),
# bf16 compute, and the time of a step. Each rank's numbers come from the run's own summary
# (`dist mpi: per rank optimizer state (moments) MB / peak RSS MB`); the accounting columns
# are ZeRO's bytes per parameter (2 working + 4 master + 4 gradient + 8 moments; masters and
# moments divided by N when sharded: 6 + 12/N) times the parameter count. By hand, never in CI (minutes).
#   bench/zero_memory.sh BUILD_DIR [RANKS...]      (default ranks: 1 2 4)
set -euo pipefail
build=$(cd "$1" && pwd); shift
if [ $# -gt 0 ]; then ranks=("$@"); else ranks=(1 2 4); fi
data="$build/data/text.safetensors"
[ -f "$data" ] || { echo "zero_memory: no $data (ninja -C $build belay_text_corpus)" >&2; exit 2; }
steps=4
run=(train --dist mpi --model gpt --data "$data" --layers 12 --width 768 --heads 12 --context 64 --batch 4
     --dtype bf16 --steps "$steps" --eval-every 0)
echo "| ranks | sharded | moments MB per rank | peak RSS MB per rank | s per step | ZeRO-1 accounting MB per rank | buckets done before backward ended, per step |"
echo "|---|---|---|---|---|---|---|"
for n in "${ranks[@]}"; do
  for shard in no yes; do
    extra=()
    [ "$shard" = yes ] && extra=(--shard-optimizer)
    # One OpenMP thread per core and rank: more threads than cores spin against each other
    # (4 ranks x 2 threads on 2 cores: 36 s a step instead of 3.4).
    threads=$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))
    out=$(mpirun --allow-run-as-root --oversubscribe -np "$n" -x OMP_NUM_THREADS="$threads" "$build/belay" "${run[@]}" \
          "${extra[@]}" 2>&1)
    per=$(sed -n 's/^dist mpi: per rank optimizer state (moments) MB \/ peak RSS MB: //p' <<<"$out")
    secs=$(sed -n 's/^done: .* in \([0-9.e+-]*\) s;.*/\1/p' <<<"$out")
    moments=$(tr ' ' '\n' <<<"$per" | cut -d/ -f1 | paste -sd' ')
    rss=$(tr ' ' '\n' <<<"$per" | cut -d/ -f2 | paste -sd' ')
    # Parameters from the unsharded moments (8 bytes each); the accounting for this row.
    total=$(tr ' ' '\n' <<<"$moments" | awk '{s += $1} END {print s}')
    acc=$(awk -v m="$total" -v n="$n" -v sh="$shard" 'BEGIN {
      p = (sh == "yes" ? m : m / n) / 8;  # MB of moments -> M parameters (unsharded: every rank holds all)
      if (sh == "yes") printf "%.0f", p * (6 + 12 / n);
      else printf "%.0f", p * 18 }')
    overlap=$(sed -n 's/.*done before it ended; per step \([^)]*\)).*/\1/p' <<<"$out")
    echo "| $n | $shard | $moments | $rss | $(awk -v s="$secs" -v k="$steps" 'BEGIN{printf "%.2f", s / k}') | $acc | $overlap |"
  done
done
