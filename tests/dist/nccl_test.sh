#!/usr/bin/env bash
# `mpirun -np 2 belay train --dist nccl --device cuda` on the emulated device (each rank one
# process with its own emulated GPU, BELAY_EMU_DEVICES=2; the emulated NCCL of
# kernels/cuda/emulation/nccl.cpp in place of libnccl), the cases of dist_test.sh for MPI,
# sharded optimizer state (--shard-optimizer) as zero_test.sh has it for MPI,
# and what a real multi-GPU job needs: a shared GPU refused, NCCL's init bounded by
# --dist-timeout, NCCL's asynchronous error named. No GPU runs any of this.
#   usage: nccl_test.sh path/to/belay path/to/compare_checkpoints path/to/nccl_ring_tests
#
# The bound, stated before any run. The ring sums each element in the gradient buffer's own
# dtype, rounding at each of its N-1 hops: |ring - exact| <= (N-1) u sum_r |x_r| (u = 2^-24
# FP32, 2^-11 FP16, 2^-8 BF16). belay's gradient buffers are FP32 (the default --grad-dtype),
# so on 2 ranks the sum is ONE FP32 rounding of the two halves' sum, as over MPI: the runs
# differ from one process only in how the batch mean is summed, relative ~ n 2^-24 ~ 2e-6 of
# the gradient; AdamW moves a weight by at most lr (0.01) per step and a relative change d of
# the gradient changes that by ~ d lr, so 20 steps give ~ 20 * 0.01 * 2e-6 = 4e-7: weights
# within 1e-5 (a margin of 25), far below one wrong step (1e-2). The per-hop rounding in
# FP16/BF16 and its order on 3 ranks are checked bit for bit by nccl_ring_tests (below).
set -u
belay=$1
compare=$2
ring_tests=$3
. "$(dirname "${BASH_SOURCE[0]}")/../shell_test_lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "skipped: mpirun not found (install openmpi-bin: third_party/install_deps.sh)"
  exit 77
fi
use_mpirun
export BELAY_EMU_DEVICES=2
belt_columns() { cut -d, -f1,2,6,7,8 "$1"; }
nccl=(--dist nccl --device cuda)

# 0. The emulated NCCL itself on 3 and 2 ranks: all-reduce and reduce-scatter summed in the
# ring's order in every dtype, bit for bit, in place or not; all-gather's blocks exact.
for n in 3 2; do
  out=$(BELAY_EMU_DEVICES=$n mpi $n "$ring_tests" 2>&1) &&
    pass "ring on $n ranks: all-reduce, reduce-scatter, all-gather; fp32, fp16, bf16, slices, in NCCL's order" ||
    fail "ring on $n ranks: $out"
done

run_pair() {  # NAME ARGS...: one process against 2 ranks, each writing a CSV and a checkpoint
  local name=$1
  shift
  "$belay" train --device cuda --quiet --csv "$tmp/$name.one.csv" --checkpoint "$tmp/$name.one.ckpt" "$@" \
    >"$tmp/$name.one.out" 2>&1 || { fail "$name: one process failed: $(cat "$tmp/$name.one.out")"; return 1; }
  mpi 2 "$belay" train "${nccl[@]}" --csv "$tmp/$name.two.csv" --checkpoint "$tmp/$name.two.ckpt" "$@" "${two_only[@]}" \
    >"$tmp/$name.two.out" 2>&1 || { fail "$name: two ranks failed: $(cat "$tmp/$name.two.out")"; return 1; }
}
two_only=()

# 1. fp32 with clipping (the agreed norm decides it): 2 ranks x 16 rows vs 1 x 32 rows.
if run_pair fp32 --dtype fp32 --steps 20 --batch 32 --seed 3 --clip 0.5; then
  "$compare" "$tmp/fp32.one.ckpt" "$tmp/fp32.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "fp32: 2 ranks over NCCL = 1 process, weights within 1e-5" || { fail "fp32: weights"; cat "$tmp/cmp"; }
  diff <(belt_columns "$tmp/fp32.one.csv") <(belt_columns "$tmp/fp32.two.csv") >/dev/null &&
    pass "fp32: CSV step/lr/skip/scale columns identical" || fail "fp32: CSV columns differ"
  grep -q '^dist nccl: 2 ranks; per rank 20 gradient all-reduces' "$tmp/fp32.two.out" &&
    pass "fp32: 20 gradient all-reduces per rank" || fail "fp32: $(grep '^dist' "$tmp/fp32.two.out")"
fi

# 2. fp16 with accumulation, a growing scale and a spike that overflows the scaled gradient
# at step 5 (a real skip, not a planted one), many buckets: the same skips and scale
# sequence, weights within the fp32 bound (FP32 gradient buffers).
fp16=(--model mlp --in 32 --hidden 64 --layers 2 --dtype fp16 --steps 8 --batch 32 --seed 3 --micro-batch 8
      --growth-interval 2 --spike 5:1e4 --bucket-mb 0.01)
if run_pair fp16 "${fp16[@]}"; then
  skips=$(awk -F, 'NR > 1 && $6 == 1 {print $1}' "$tmp/fp16.one.csv" | tr '\n' ' ')
  if [ -n "$skips" ] && diff <(belt_columns "$tmp/fp16.one.csv") <(belt_columns "$tmp/fp16.two.csv") >/dev/null; then
    pass "fp16 accum: the same overflow skips ($skips) and scale sequence on 2 x 2 ranks as 4 x 1"
  else
    fail "fp16 accum: skips '$skips', or the belt columns differ"
  fi
  "$compare" "$tmp/fp16.one.ckpt" "$tmp/fp16.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "fp16 accum: weights within 1e-5" || { fail "fp16 accum: weights"; cat "$tmp/cmp"; }
  n=$(sed -n 's/^dist nccl: \([0-9]*\) buckets.*/\1/p' "$tmp/fp16.two.out")
  [ "${n:-0}" -gt 8 ] && pass "fp16 accum: $n buckets of 0.01 MB in 8 steps" || fail "fp16 accum: buckets: $n"
  # Resume: stop at step 4 on 2 ranks, finish on 2 ranks: the 2-rank run of one go above.
  mpi 2 "$belay" train "${nccl[@]}" "${fp16[@]}" --stop-at 4 --checkpoint "$tmp/r.ckpt" --csv "$tmp/r.csv" --quiet \
    >"$tmp/out" 2>&1 && mpi 2 "$belay" train "${nccl[@]}" "${fp16[@]}" --resume "$tmp/r.ckpt" --checkpoint "$tmp/r.ckpt" \
    --csv "$tmp/r.csv" --quiet >>"$tmp/out" 2>&1 || fail "resume: $(cat "$tmp/out")"
  if "$compare" "$tmp/fp16.two.ckpt" "$tmp/r.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$tmp/fp16.two.csv" "$tmp/r.csv"; then
    pass "resume at step 4: bit for bit the run of one go (weights, moments, scaler, CSV)"
  else
    fail "resume at step 4 differs"
    cat "$tmp/cmp"
  fi
fi
two_only=()

# 2b. BF16 gradient buffers (--grad-dtype compute), summed in their dtype with a
# rounding per hop: the all-gather hands every rank the same bits, so the replicas agree
# after every step (a checkpoint every step compares their checksums; a mismatch stops the
# run). Against one process no bound is claimed here: the per-hop bound (N-1) u sum_r |x_r|
# is on the ranks' own gradients, which may cancel (nccl_ring_tests checks it element-wise).
for dt in bf16; do
  mpi 2 "$belay" train "${nccl[@]}" --model mlp --in 32 --hidden 64 --dtype $dt --grad-dtype compute --steps 4 \
    --batch 32 --seed 4 --checkpoint "$tmp/$dt.ckpt" --checkpoint-every 1 --quiet >"$tmp/out" 2>&1 &&
    pass "$dt gradient buffers: 4 steps, the replicas' checksums agree after every step" ||
    fail "$dt gradient buffers: $(cat "$tmp/out")"
done

# 3. An inf planted on rank 1 only: only the belts' agreement tells rank 0; both skip step 5,
# and the replicas agree after every step (a checkpoint every step checks it).
two_only=(--inject-rank 1)
if run_pair inject --dtype fp16 --steps 8 --batch 32 --seed 7 --inject-inf 5 --checkpoint-every 1; then
  row=$(awk -F, '$1 == 5' "$tmp/inject.two.csv")
  case "$row" in
    *,1,nonfinite_grad,32768) pass "inject: rank 1 alone planted an inf at step 5, both skipped it: $row" ;;
    *) fail "inject: row 5 is '$row'" ;;
  esac
  diff <(belt_columns "$tmp/inject.one.csv") <(belt_columns "$tmp/inject.two.csv") >/dev/null &&
    pass "inject: skip and scale columns match one process with the same inf" || fail "inject: columns differ"
fi
two_only=()

# 3b. Sharded optimizer state (--shard-optimizer, ZeRO stage 1 over NCCL: a packed
# ncclReduceScatter per bucket, ncclAllGather of the updated parameters). The bound is the
# unsharded one's: on 2 ranks each gradient element is one rounding of a + b in the
# reduce-scatter as in the all-reduce, so against one process the weights are within the
# same 1e-5 and the belt columns identical; against the unsharded 2-rank run, where nothing
# clips (the clip coefficient is 1 whatever the norm's last bits: the sharded norm groups the
# guard's FP64 sums per tensor, the unsharded guard in one tree), every weight, moment and
# CSV column but the norm's is the same, bit for bit.
two_only=(--shard-optimizer)
if run_pair zfp32 --dtype fp32 --steps 20 --batch 32 --seed 3 --clip 0.5; then
  "$compare" "$tmp/zfp32.one.ckpt" "$tmp/zfp32.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "sharded fp32: 2 ranks over NCCL = 1 process, weights within 1e-5" || { fail "sharded fp32: weights"; cat "$tmp/cmp"; }
  diff <(belt_columns "$tmp/zfp32.one.csv") <(belt_columns "$tmp/zfp32.two.csv") >/dev/null &&
    pass "sharded fp32: CSV step/lr/skip/scale columns identical" || fail "sharded fp32: CSV columns differ"
  grep -q '^dist nccl: optimizer state sharded' "$tmp/zfp32.two.out" &&
    pass "sharded fp32: the run says its state is sharded" || fail "sharded fp32: $(grep '^dist' "$tmp/zfp32.two.out")"
fi
no_norm() { cut -d, -f1,2,5- "$1"; }  # step,lr,loss,skipped,skip_reason,scaler_scale
# fp16, the spike's real skip, many buckets (0.01 MB; whole tensors pad the blocks unevenly).
if run_pair zfp16 "${fp16[@]}"; then
  diff <(belt_columns "$tmp/zfp16.one.csv") <(belt_columns "$tmp/zfp16.two.csv") >/dev/null &&
    pass "sharded fp16 accum: the same overflow skips and scale sequence as 1 process" || fail "sharded fp16 accum: columns"
  if "$compare" "$tmp/fp16.two.ckpt" "$tmp/zfp16.two.ckpt" 0 >"$tmp/cmp" 2>&1 &&
    diff <(no_norm "$tmp/fp16.two.csv") <(no_norm "$tmp/zfp16.two.csv") >/dev/null; then
    pass "sharded fp16 accum: = the unsharded 2-rank run, every weight, moment and CSV column but the norm"
  else
    fail "sharded fp16 accum vs unsharded"
    cat "$tmp/cmp"
  fi
  # Resume: a sharded checkpoint (gathered from the GPUs to rank 0) at step 4, finished sharded.
  mpi 2 "$belay" train "${nccl[@]}" --shard-optimizer "${fp16[@]}" --stop-at 4 --checkpoint "$tmp/zr.ckpt"     --csv "$tmp/zr.csv" --quiet >"$tmp/out" 2>&1 && mpi 2 "$belay" train "${nccl[@]}" --shard-optimizer "${fp16[@]}"     --resume "$tmp/zr.ckpt" --checkpoint "$tmp/zr.ckpt" --csv "$tmp/zr.csv" --quiet >>"$tmp/out" 2>&1 ||
    fail "sharded resume: $(cat "$tmp/out")"
  if "$compare" "$tmp/zfp16.two.ckpt" "$tmp/zr.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$tmp/zfp16.two.csv" "$tmp/zr.csv"; then
    pass "sharded resume at step 4: bit for bit the sharded run of one go"
  else
    fail "sharded resume at step 4 differs"
    cat "$tmp/cmp"
  fi
fi
# BF16 gradient buffers: the reduce-scatter sums in BF16 (one rounding of a + b on 2 ranks,
# as the all-reduce): sharded = unsharded on 2 ranks, bit for bit.
bf=(--model mlp --in 32 --hidden 64 --dtype bf16 --grad-dtype compute --steps 4 --batch 32 --seed 4)
for z in plain sharded; do
  extra=()
  [ $z = sharded ] && extra=(--shard-optimizer)
  mpi 2 "$belay" train "${nccl[@]}" "${bf[@]}" "${extra[@]}" --checkpoint "$tmp/bf.$z.ckpt" --csv "$tmp/bf.$z.csv" \
    --quiet >"$tmp/out" 2>&1 || fail "bf16 gradient buffers, $z: $(cat "$tmp/out")"
done
"$compare" "$tmp/bf.plain.ckpt" "$tmp/bf.sharded.ckpt" 0 >"$tmp/cmp" 2>&1 &&
  diff <(no_norm "$tmp/bf.plain.csv") <(no_norm "$tmp/bf.sharded.csv") >/dev/null &&
  pass "sharded bf16 gradient buffers: = unsharded on 2 ranks, bit for bit" || { fail "sharded bf16 vs unsharded"; cat "$tmp/cmp"; }
# 3 ranks (3 emulated GPUs): the reduce-scatter's order (block b from rank b+1 round to b) is
# not the all-reduce's, so sharded and unsharded differ by at most the two FP32 roundings of
# each gradient sum, relative 2 x 2^-24 ~ 1.2e-7 (FP32 buffers): AdamW moves a weight by at
# most lr (0.01) a step, changed by ~ 1.2e-7 lr, so 8 steps part them by ~ 1e-8, far inside
# 1e-5 (one wrong step is 1e-2); the belt columns are the same.
three=(--model mlp --in 32 --hidden 64 --layers 2 --dtype fp16 --steps 8 --batch 48 --seed 3 --micro-batch 8
       --bucket-mb 0.01 --quiet)
for z in plain sharded; do
  extra=()
  [ $z = sharded ] && extra=(--shard-optimizer)
  BELAY_EMU_DEVICES=3 mpi 3 "$belay" train "${nccl[@]}" "${three[@]}" "${extra[@]}" --checkpoint "$tmp/three.$z.ckpt" \
    --csv "$tmp/three.$z.csv" >"$tmp/out" 2>&1 || fail "3 ranks, $z: $(cat "$tmp/out")"
done
if "$compare" "$tmp/three.plain.ckpt" "$tmp/three.sharded.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
  diff <(belt_columns "$tmp/three.plain.csv") <(belt_columns "$tmp/three.sharded.csv") >/dev/null; then
  pass "sharded on 3 ranks: weights within 1e-5 of unsharded, the belt columns identical"
else
  fail "sharded on 3 ranks vs unsharded"
  cat "$tmp/cmp"
fi
# An inf planted on rank 1 after the sync: the agreement on the guard's per-tensor sums
# (non-finite counts from any rank) makes both skip step 5.
two_only=(--inject-rank 1 --shard-optimizer)
if run_pair zinject --dtype fp16 --steps 8 --batch 32 --seed 7 --inject-inf 5; then
  row=$(awk -F, '$1 == 5' "$tmp/zinject.two.csv")
  case "$row" in
    *,1,nonfinite_grad,32768) pass "sharded inject: rank 1 alone planted an inf at step 5, both skipped it: $row" ;;
    *) fail "sharded inject: row 5 is '$row'" ;;
  esac
  diff <(belt_columns "$tmp/zinject.one.csv") <(belt_columns "$tmp/zinject.two.csv") >/dev/null &&
    pass "sharded inject: skip and scale columns match one process" || fail "sharded inject: columns differ"
fi
two_only=()

# 4. Two ranks that would share a GPU (one emulated device): refused before NCCL starts.
BELAY_EMU_DEVICES=1 expect_mpirun_error "2 ranks, 1 GPU" 2 'two ranks would share a GPU' \
  2 "$belay" train "${nccl[@]}" --steps 1

# 5. Failures, each ending every rank with exit 1 and belay's line naming the cause (the
# timeout is the bound, far above what is needed, not a measurement).
failure() {  # NAME PATTERN ENV ARGS...
  local name=$1 want=$2 env=$3
  shift 3
  env $env timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$belay" train "${nccl[@]}" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && belay_lines "$tmp/$name.err" | grep -q "$want"; then
    pass "$name: exit $rc: $(belay_lines "$tmp/$name.err" | grep -m1 "$want")"
  else
    fail "$name: exit $rc (124: still running at the bound), stderr: $(cat "$tmp/$name.err")"
  fi
}
# NCCL's init never completes (rank 1 never joins): bounded by --dist-timeout.
failure init_hang "^belay: error: rank [01]: no answer from the other ranks for 2 s in NCCL's init" \
  BELAY_EMU_NCCL_HANG_RANK=1 --steps 3 --dist-timeout 2
# An asynchronous NCCL error on rank 1's 4th all-reduce: read while waiting, named.
failure async_error "^belay: error: rank 1: NCCL: asynchronous error in .*: unhandled system error" \
  BELAY_EMU_NCCL_FAIL=1:3 --steps 10 --dist-timeout 60

# 6. A rank killed or stopped mid-run: one line, and the last checkpoint resumes to the bits
# of an uninterrupted run (the helpers of dist_test.sh).
children() {
  local d
  for d in /proc/[0-9]*; do [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"; done
}
rank_pid() {
  local p
  for p in $(children "$1"); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
}
kill_run=(--model mlp --in 32 --hidden 64 --steps 100000 --seed 9)
failure_case() {  # NAME SIGNAL EXPECTED-STDERR-PATTERN DIST-TIMEOUT [resume]
  local name=$1 sig=$2 want=$3 dist_timeout=$4 resume=${5:-} mp victim rc rows kstop
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$belay" train "${nccl[@]}" "${kill_run[@]}" \
    --dist-timeout "$dist_timeout" --checkpoint "$tmp/$name.ckpt" --checkpoint-every 2 --csv "$tmp/$name.csv" --quiet \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  mp=$!
  for _ in $(seq 600); do [ -f "$tmp/$name.ckpt" ] && [ "$(wc -l <"$tmp/$name.csv")" -gt 4 ] && break; sleep 0.1; done
  victim=$(rank_pid "$(children $mp | head -1)" 1)
  if [ -z "$victim" ]; then
    fail "$name: rank 1 not found"
    kill $mp 2>/dev/null
    wait $mp
    return
  fi
  kill -$sig "$victim"
  wait $mp
  rc=$?
  tr '\0' '\n' 2>/dev/null <"/proc/$victim/environ" | grep -qx "OMPI_COMM_WORLD_RANK=1" && kill -KILL "$victim" 2>/dev/null
  local lines=cat
  [[ "$want" == '^belay: '* ]] && lines=belay_lines
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && $lines "$tmp/$name.err" | grep -q "$want"; then
    pass "$name: stopped, exit $rc: $($lines "$tmp/$name.err" | grep -m1 "$want")"
  else
    fail "$name: exit $rc (124: still running at the bound), stderr: $(cat "$tmp/$name.err")"
  fi
  [ "$resume" = resume ] || return
  rows=$(($(wc -l <"$tmp/$name.csv") - 1))
  kstop=$((rows + 3))
  mpi 2 "$belay" train "${nccl[@]}" "${kill_run[@]}" --stop-at $kstop --resume "$tmp/$name.ckpt" \
    --checkpoint "$tmp/$name.ckpt" --csv "$tmp/$name.csv" --quiet >"$tmp/out" 2>&1 || fail "$name: resume: $(cat "$tmp/out")"
  mpi 2 "$belay" train "${nccl[@]}" "${kill_run[@]}" --stop-at $kstop --checkpoint "$tmp/$name.whole.ckpt" \
    --csv "$tmp/$name.whole.csv" --quiet >"$tmp/out" 2>&1 || fail "$name: uninterrupted run: $(cat "$tmp/out")"
  if "$compare" "$tmp/$name.whole.ckpt" "$tmp/$name.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$tmp/$name.whole.csv" "$tmp/$name.csv"; then
    pass "$name: the last checkpoint resumed to step $kstop, bit for bit an uninterrupted run"
  else
    fail "$name: resume after the failure differs from an uninterrupted run"
    cat "$tmp/cmp"
  fi
}
# The resume after a failure once (after the kill; a stopped rank leaves the same checkpoints).
failure_case kill9 KILL 'exited on signal 9' 60 resume
failure_case hang STOP '^belay: error: rank 0: no answer from the other ranks for 2 s in ' 2
# The same with sharded state: every wait on the reduce-scatter and the all-gather is one the
# deadline bounds (the loss's polled read comes before the guard's host read), and the last
# sharded checkpoint (gathered from the GPUs) resumes to the bits of an uninterrupted run.
kill_run+=(--shard-optimizer)
failure_case zkill9 KILL 'exited on signal 9' 60 resume
failure_case zhang STOP '^belay: error: rank 0: no answer from the other ranks for 2 s in ' 2

[ $fails -eq 0 ] && echo "dist nccl: all passed" || echo "dist nccl: $fails failed"
exit $((fails > 0))
