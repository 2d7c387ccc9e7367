#!/usr/bin/env bash
# Sharded optimizer state (`--shard-optimizer`, ZeRO stage 1) over MPI: the sharded run
# against the unsharded run with the same ranks, bit for bit, at 1, 2 and 4 ranks; checkpoints
# resumed on another rank count; the usage errors.
#   usage: zero_test.sh path/to/belay path/to/compare_checkpoints HAVE_MPI(ON|OFF)
# Exit 77 (CTest: skipped) with a message when belay was built without MPI or mpirun is absent.
#
# The bound, stated before any run: none. Every tensor of the checkpoints (masters, AdamW's
# moments) within 0 (compare_checkpoints' bound: equal, NaN refused) and every CSV byte the
# same. Why it holds: both runs sum each gradient element over ranks in rank order (the
# ordered reduction, amp/dist/mpi_ordered.cpp; with 2 ranks MPI's a + b is b + a), the norm
# is the guard's per-tensor FP64 sums added in tensor order in both, and the AdamW pass
# updates each parameter with the same scalars whichever rank runs it.
set -u
belay=$1
compare=$2
have_mpi=$3
. "$(dirname "${BASH_SOURCE[0]}")/../shell_test_lib.sh"

expect_one_line_error "--shard-optimizer without --dist" 2 "needs --dist mpi" train --shard-optimizer --steps 1

skip_without_mpirun "$have_mpi"
use_mpirun

# A small MLP (5 tensors of different sizes: every rank of 4 owns one or two), clipping active.
model=(--model mlp --in 16 --hidden 24 --layers 3 --out 4 --batch 32 --micro-batch 8 --seed 3)

# same_bits WHAT A B: the runs that wrote A.ckpt, A.csv and B.ckpt, B.csv agree in every
# tensor and every CSV byte (pass WHAT), or fail WHAT with the differences.
same_bits() {
  local what=$1 a=$2 b=$3
  if "$compare" "$a.ckpt" "$b.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$a.csv" "$b.csv"; then
    pass "$what"
  else
    fail "$what"
    sed 's/^/     /' "$tmp/cmp"
    diff "$a.csv" "$b.csv" | head -5 | sed 's/^/     /'
  fi
}

# same NAME RANKS ARGS...: RANKS ranks unsharded and sharded, each writing a CSV and a
# checkpoint; then every tensor and every CSV byte compared.
same() {
  local name=$1 n=$2
  shift 2
  local plain="$tmp/$name.plain" sharded="$tmp/$name.sharded"
  mpi "$n" "$belay" train --dist mpi "${model[@]}" "$@" --csv "$plain.csv" --checkpoint "$plain.ckpt" \
    >"$plain.out" 2>&1 || { fail "$name: unsharded run failed: $(tail -3 "$plain.out")"; return 1; }
  mpi "$n" "$belay" train --dist mpi --shard-optimizer "${model[@]}" "$@" --csv "$sharded.csv" \
    --checkpoint "$sharded.ckpt" >"$sharded.out" 2>&1 ||
    { fail "$name: sharded run failed: $(tail -3 "$sharded.out")"; return 1; }
  same_bits "$name: $n ranks sharded = unsharded, every weight, moment and CSV byte" "$plain" "$sharded"
  return 0
}

# 1. fp32 with clipping, at 1, 2 and 4 ranks.
fp32=(--dtype fp32 --steps 8 --clip 0.05 --lr 0.01)
for n in 1 2 4; do same "fp32.$n" "$n" "${fp32[@]}"; done
grep '^dist mpi' "$tmp/fp32.4.sharded.out" | sed 's/^/     /'
clipped=$(awk -F, 'NR > 1 && $4 < $3 {n++} END {print n + 0}' "$tmp/fp32.4.sharded.csv")
[ "$clipped" -gt 0 ] && pass "fp32: clipping acted on $clipped steps (the agreed norm decided it)" ||
  fail "fp32: no step was clipped: the test does not exercise the norm"

# The overlap, per step, reported by both paths.
for run in plain sharded; do
  grep -q 'done before it ended; per step [0-9.]* of [0-9.]*, min [0-9]* max [0-9]*)' "$tmp/fp32.4.$run.out" &&
    pass "fp32.4 $run: the summary gives the buckets done before backward ended, per step" ||
    fail "fp32.4 $run: no per-step overlap in: $(grep buckets "$tmp/fp32.4.$run.out")"
done

# bf16: the masters of what a rank does not own are freed (the working copy is its own tensor).
same bf16.4 4 --dtype bf16 --steps 8 --clip 0.05 --lr 0.01

# 2. fp16 with loss scaling, a real overflow (a spike) and a growing scale, at 4 ranks.
same fp16.4 4 --dtype fp16 --steps 10 --growth-interval 2 --spike 5:1e4
skips=$(awk -F, 'NR > 1 && $6 == 1 {print $1}' "$tmp/fp16.4.sharded.csv" | tr '\n' ' ')
[ -n "$skips" ] && pass "fp16: the overflow skipped step(s) $skips on every rank, sharded or not" ||
  fail "fp16: no step skipped: the spike did not overflow"

# FP16 gradient buffers (--grad-dtype compute): widened to FP32, summed, rounded once.
same fp16grads.4 4 --dtype fp16 --grad-dtype compute --steps 10 --growth-interval 2

# 2b. One process accumulating the 4 micro-batches of 8 rows adds their gradients in the same
# order, ((g0 + g1) + g2) + g3, into its FP32 buffers, as the ordered reduction adds the 4
# ranks' (rank k holds micro-batch k's rows): the 4-rank sharded runs are that process's bits.
for name in fp32 fp16; do
  [ "$name" = fp32 ] && args=("${fp32[@]}") || args=(--dtype fp16 --steps 10 --growth-interval 2 --spike 5:1e4)
  "$belay" train --quiet "${model[@]}" "${args[@]}" --csv "$tmp/$name.one.csv" --checkpoint "$tmp/$name.one.ckpt" \
    >"$tmp/$name.one.out" 2>&1 || fail "$name: one process failed: $(tail -3 "$tmp/$name.one.out")"
  same_bits "$name: 4 sharded ranks = 1 process accumulating 4 micro-batches, bit for bit" \
    "$tmp/$name.one" "$tmp/$name.4.sharded"
done

# 2c. Many buckets (one tensor each) moved by the progress thread: the same bits again.
same fp16.buckets.4 4 --dtype fp16 --steps 10 --growth-interval 2 --spike 5:1e4 --bucket-mb 0.001 --dist-progress-thread
same_bits "fp16: 4 sharded ranks in $(sed -n 's/^dist mpi: \([0-9]*\) buckets.*/\1/p' "$tmp/fp16.buckets.4.sharded.out") buckets with the progress thread = 1 process, bit for bit" \
  "$tmp/fp16.one" "$tmp/fp16.buckets.4.sharded"

# 3. An inf planted after the sync in one rank's copy of the first parameter (the first
# layer's weight, which the 4-rank plan gives to rank 1): on its owner, and on rank 3, whose
# copy is not reduced and counts only through the agreement. Every rank skips alike.
for r in 1 3; do
  same "inject.rank$r" 4 --dtype fp32 --steps 4 --inject-inf 2 --inject-rank "$r"
  [ "$(awk -F, '$1 == 2 {print $6}' "$tmp/inject.rank$r.sharded.csv")" = 1 ] &&
    pass "inject on rank $r: step 2 skipped" || fail "inject on rank $r: step 2 not skipped"
done

# 4. Resume: a sharded 2-rank checkpoint is the unsharded one (the same file but its "shards"
# record), and resumes on 4 sharded ranks and on 1 process as the unsharded checkpoint does.
half=(--dtype fp16 --steps 10 --growth-interval 2)
full=(--dtype fp16 --steps 16 --growth-interval 2)
mpi 2 "$belay" train --dist mpi "${model[@]}" "${half[@]}" --checkpoint "$tmp/r.plain.ckpt" >"$tmp/r1.out" 2>&1 &&
  mpi 2 "$belay" train --dist mpi --shard-optimizer "${model[@]}" "${half[@]}" --checkpoint "$tmp/r.sharded.ckpt" \
    >"$tmp/r2.out" 2>&1 || fail "resume: the 2-rank runs failed: $(cat "$tmp/r1.out" "$tmp/r2.out" | tail -3)"
"$compare" "$tmp/r.plain.ckpt" "$tmp/r.sharded.ckpt" 0 >"$tmp/cmp" 2>&1 &&
  pass "resume: the sharded 2-rank checkpoint holds the unsharded one's tensors and state, bit for bit" ||
  { fail "resume: 2-rank checkpoints differ"; sed 's/^/     /' "$tmp/cmp"; }
resumed() {  # resumed NAME CKPT RANKS ARGS...: the run from CKPT to step 16 (RANKS 0: one process, no mpirun)
  local name=$1 ckpt=$2 n=$3
  shift 3
  local launch=("$belay")
  [ "$n" -gt 0 ] && launch=(mpi "$n" "$belay")
  "${launch[@]}" train "${model[@]}" "${full[@]}" --resume "$ckpt" --checkpoint "$tmp/$name.ckpt" \
    --csv "$tmp/$name.csv" "$@" >"$tmp/$name.out" 2>&1 || fail "resume $name: $(tail -3 "$tmp/$name.out")"
}
resumed to4.plain "$tmp/r.plain.ckpt" 4 --dist mpi
resumed to4.sharded "$tmp/r.sharded.ckpt" 4 --dist mpi --shard-optimizer
resumed to1.plain "$tmp/r.plain.ckpt" 0
resumed to1.sharded "$tmp/r.sharded.ckpt" 0
for to in to4 to1; do
  same_bits "resume 2 -> ${to#to}: from the sharded checkpoint = from the unsharded one, bit for bit" \
    "$tmp/$to.plain" "$tmp/$to.sharded"
done
grep -aq '"shards":"2:' "$tmp/r.sharded.ckpt" && pass "resume: the checkpoint records the 2-rank layout" ||
  fail "resume: no shard layout in the checkpoint's metadata"

# 5. What the sharded path refuses, one line each.
expect_mpirun_error "--shard-optimizer with sgd" 2 "optimizer sgd" 2 "$belay" train --dist mpi --shard-optimizer \
  --optimizer sgd --steps 1
expect_mpirun_error "--shard-optimizer with --unfused" 2 "fused step" 2 "$belay" train --dist mpi --shard-optimizer \
  --unfused --steps 1

[ $fails -eq 0 ] || exit 1
