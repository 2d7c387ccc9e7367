#!/usr/bin/env bash
# Data parallelism over MPI, as a user runs it: `mpirun -np 2 belay train --dist mpi` against
# one process with the whole batch.
#   usage: dist_test.sh path/to/belay path/to/compare_checkpoints HAVE_MPI(ON|OFF)
# Exit 77 (CTest: skipped) with a message when belay was built without MPI or mpirun is absent.
#
# The bound, stated before any run: fp32 weights (and AdamW moments) within 1e-5 absolute
# after 20 steps. Why it holds: the two runs differ only in how the batch mean of the
# gradient is summed (one sum of 32 rows vs two sums of 16 rows averaged), a few FP32
# roundings, relative ~ n * 2^-24 ~ 2e-6 of the gradient; AdamW moves a weight by at most
# lr (0.01) per step, and a relative change d of the gradient changes that move by ~ d *
# lr, so 20 steps give ~ 20 * 0.01 * 2e-6 = 4e-7: 1e-5 leaves a margin of 25 yet is far
# below what one wrong step (1e-2) or a missing average (a step twice too long) would do.
set -u
belay=$1
compare=$2
have_mpi=$3
. "$(dirname "${BASH_SOURCE[0]}")/../shell_test_lib.sh"

# expect_error NAME ARGS...: exit 2, one line on stderr naming the problem (any build).
expect_error() {
  local name=$1
  shift
  expect_one_line_error "$name" 2 "" "$@"
}
expect_error "unknown --dist" train --dist tcp --steps 1
expect_error "--dist nccl" train --dist nccl --steps 1
expect_error "--inject-rank beyond one process" train --inject-rank 1 --inject-inf 0 --steps 1

if [ "$have_mpi" != "ON" ]; then
  # The build without MPI still says what to do, on one line, exit 2.
  "$belay" train --dist mpi --steps 1 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q 'built without MPI' "$tmp/err"; then
    pass "--dist mpi without MPI built in: $(cat "$tmp/err")"
  else
    fail "--dist mpi without MPI: exit $rc, $(cat "$tmp/err")"
  fi
  [ $fails -eq 0 ] || exit 1
fi
skip_without_mpirun "$have_mpi"
use_mpirun

# The columns that must be identical: step, lr, skipped, skip_reason, scaler_scale.
belt_columns() { cut -d, -f1,2,6,7,8 "$1"; }

# run NAME ARGS...: one process and two ranks with the same effective batch, each writing a
# CSV and a checkpoint under $tmp/NAME.{one,two}.*; the two ranks also get "${two_only[@]}".
two_only=()
run_pair() {
  local name=$1
  shift
  "$belay" train --quiet --csv "$tmp/$name.one.csv" --checkpoint "$tmp/$name.one.ckpt" "$@" \
    >"$tmp/$name.one.out" 2>&1 || { fail "$name: one process failed: $(cat "$tmp/$name.one.out")"; return 1; }
  mpi 2 "$belay" train --dist mpi --csv "$tmp/$name.two.csv" --checkpoint "$tmp/$name.two.ckpt" "$@" "${two_only[@]}" \
    >"$tmp/$name.two.out" 2>&1 || { fail "$name: two ranks failed: $(cat "$tmp/$name.two.out")"; return 1; }
  return 0
}

# 1. fp32, clipping active (the agreed norm decides it): 2 ranks x 16 rows vs 1 x 32 rows.
fp32=(--dtype fp32 --steps 20 --batch 32 --seed 3 --clip 0.5)
if run_pair fp32 "${fp32[@]}"; then
  grep '^dist mpi: 2 ranks' "$tmp/fp32.two.out" | sed 's/^/     /'
  if "$compare" "$tmp/fp32.one.ckpt" "$tmp/fp32.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1; then
    pass "fp32: 2 ranks = 1 process, weights within 1e-5"
  else
    fail "fp32: 2 ranks vs 1 process"
  fi
  sed 's/^/     /' "$tmp/cmp"
  if diff <(belt_columns "$tmp/fp32.one.csv") <(belt_columns "$tmp/fp32.two.csv") >/dev/null; then
    pass "fp32: CSV step/lr/skip/scale columns identical"
  else
    fail "fp32: CSV columns differ"
  fi
  # The pre-clip norm and the loss (the mean over ranks) of every step within 1e-5 relative
  # of one process's: AdamW barely notices a gradient twice too long, the norm does.
  worst=$(paste -d, "$tmp/fp32.one.csv" "$tmp/fp32.two.csv" | awk -F, 'NR > 1 {
      for (c = 3; c <= 5; c += 2) { d = ($c - $(c + 8)) / $c; if (d < 0) d = -d; if (d > w) w = d } }
      END { printf "%.3g", w }')
  awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' && pass "fp32: norm and loss columns within 1e-5 relative (worst $worst)" ||
    fail "fp32: norm or loss columns differ by $worst relative"
  # Rank 0 writes the log alone: one header and 20 rows, not two runs interleaved.
  [ "$(wc -l <"$tmp/fp32.two.csv")" -eq 21 ] && pass "fp32: one CSV of 21 lines from rank 0" ||
    fail "fp32: CSV has $(wc -l <"$tmp/fp32.two.csv") lines"
  # 20 effective steps: 20 all-reduces per rank, not one per micro-batch.
  grep -q '^dist mpi: 2 ranks; per rank 20 gradient all-reduces' "$tmp/fp32.two.out" &&
    pass "fp32: 20 gradient all-reduces per rank" || fail "fp32: sync count: $(grep '^dist' "$tmp/fp32.two.out")"
fi

# 2. Accumulation with ranks: 2 micro-batches x 2 ranks vs 4 micro-batches x 1 process.
# SGD without clipping, whose step is proportional to the gradient: a sum instead of an
# average would show (AdamW and clipping both hide a gradient twice too long).
if run_pair accum --dtype fp32 --steps 20 --batch 32 --seed 3 --micro-batch 8 --optimizer sgd --lr 0.05; then
  "$compare" "$tmp/accum.one.ckpt" "$tmp/accum.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "accum: 2 x 8 x 2 ranks = 4 x 8 x 1 process, weights within 1e-5" || { fail "accum"; cat "$tmp/cmp"; }
  grep -q '(2 x 8 x 2 ranks)' "$tmp/accum.two.out" && pass "accum: banner says 2 x 8 x 2 ranks" ||
    fail "accum: banner: $(head -1 "$tmp/accum.two.out")"
fi

# 3. fp16 with dynamic loss scaling: a spike overflows the scaled gradient (a real skip, not
# a planted one) and a short growth interval makes the scale move: the same skipped steps
# and the same scale sequence.
fp16=(--dtype fp16 --steps 20 --batch 32 --seed 5 --growth-interval 3 --spike 9:1e4)
if run_pair fp16 "${fp16[@]}"; then
  skips=$(awk -F, 'NR > 1 && $6 == 1 {print $1}' "$tmp/fp16.one.csv" | tr '\n' ' ')
  if [ -n "$skips" ] && diff <(belt_columns "$tmp/fp16.one.csv") <(belt_columns "$tmp/fp16.two.csv") >/dev/null; then
    pass "fp16: the same skipped steps ($skips) and scale sequence ($(cut -d, -f8 "$tmp/fp16.two.csv" | tail -n +2 | uniq | tr '\n' ' '))"
  else
    fail "fp16: skips '$skips', or the belt columns differ"
    diff <(belt_columns "$tmp/fp16.one.csv") <(belt_columns "$tmp/fp16.two.csv") | head
  fi
fi

# 3b. fp16 with accumulation and a scale that grows every 2 steps until the gradient
# overflows by itself: 2 micro-batches x 2 ranks vs 4 x 1 process. Each backward is divided
# by accumulation x world size before the all-reduce sums, so every micro-batch computes the
# same FP16 numbers on 1 or 2 ranks and overflows at the same scale. The weights: the same
# bound as FP32 (the runs differ only in the FP32 sums of the micro-batches' gradients).
fp16acc=(--dtype fp16 --steps 20 --batch 32 --seed 3 --micro-batch 8 --growth-interval 2)
if run_pair fp16acc "${fp16acc[@]}"; then
  skips=$(awk -F, 'NR > 1 && $6 == 1 {print $1}' "$tmp/fp16acc.one.csv" | tr '\n' ' ')
  if [ -n "$skips" ] && diff <(belt_columns "$tmp/fp16acc.one.csv") <(belt_columns "$tmp/fp16acc.two.csv") >/dev/null; then
    pass "fp16 accum: the same overflow skips ($skips) and scale sequence on 2 x 2 ranks as 4 x 1"
  else
    fail "fp16 accum: skips '$skips', or the belt columns differ"
  fi
  "$compare" "$tmp/fp16acc.one.ckpt" "$tmp/fp16acc.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "fp16 accum: weights within 1e-5" || { fail "fp16 accum: weights"; cat "$tmp/cmp"; }

  # Resume across world sizes: stop at step 10 on 2 ranks, finish on 1 process, and the
  # other way; both must end as the 20 steps of one process did (fp16acc.one.*).
  mpi 2 "$belay" train --dist mpi "${fp16acc[@]}" --stop-at 10 --checkpoint "$tmp/r21.ckpt" --csv "$tmp/r21.csv" \
    --quiet >"$tmp/out" 2>&1 &&
    "$belay" train "${fp16acc[@]}" --resume "$tmp/r21.ckpt" --checkpoint "$tmp/r21.ckpt" --csv "$tmp/r21.csv" \
      --quiet >>"$tmp/out" 2>&1 || fail "resume 2 -> 1 ranks: $(cat "$tmp/out")"
  "$belay" train "${fp16acc[@]}" --stop-at 10 --checkpoint "$tmp/r12.ckpt" --csv "$tmp/r12.csv" --quiet >"$tmp/out" 2>&1 &&
    mpi 2 "$belay" train --dist mpi "${fp16acc[@]}" --resume "$tmp/r12.ckpt" --checkpoint "$tmp/r12.ckpt" \
      --csv "$tmp/r12.csv" --quiet >>"$tmp/out" 2>&1 || fail "resume 1 -> 2 ranks: $(cat "$tmp/out")"
  for r in r21 r12; do
    if "$compare" "$tmp/fp16acc.one.ckpt" "$tmp/$r.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
      diff <(belt_columns "$tmp/fp16acc.one.csv") <(belt_columns "$tmp/$r.csv") >/dev/null; then
      pass "resume $r (ranks before -> after step 10): the CSV's belt columns and the weights of one 20-step run"
    else
      fail "resume $r"
      cat "$tmp/cmp"
    fi
  done
fi

# 4. An inf planted on rank 1 only, after the all-reduce: only the agreement of the belts
# tells rank 0. Both must skip step 5 and back off; a checkpoint every step checks (by an
# all-reduced checksum of the masters and the scaler state) that the ranks agree after every
# step, and the run matches one process with the inf planted at step 5.
inj=(--dtype fp16 --steps 12 --batch 32 --seed 7 --inject-inf 5)
two_only=(--inject-rank 1)
if run_pair inject "${inj[@]}" --checkpoint-every 1; then
  row=$(awk -F, '$1 == 5' "$tmp/inject.two.csv")
  case "$row" in
    *,1,nonfinite_grad,32768) pass "inject: rank 1 alone planted an inf at step 5, the run skipped it: $row" ;;
    *) fail "inject: row 5 is '$row'" ;;
  esac
  diff <(belt_columns "$tmp/inject.one.csv") <(belt_columns "$tmp/inject.two.csv") >/dev/null &&
    pass "inject: the skip and scale columns match one process with the same inf" || fail "inject: columns differ"
  "$compare" "$tmp/inject.one.ckpt" "$tmp/inject.two.ckpt" 1e-5 >"$tmp/cmp" 2>&1 &&
    pass "inject: scaler state equal, weights within 1e-5 of one process" || { fail "inject: state"; cat "$tmp/cmp"; }
fi

# 4b. The GPT (--model gpt) on a tiny tokens file made here: 2 ranks x 4 sequences vs 1 x 8,
# fp32, clipped, with the held-out loss. The bound, stated before the run: every step's
# loss, pre-clip norm and held-out loss within 1e-4 relative, the belt columns identical. The
# runs differ in how the weight gradients sum over rows (FP32 roundings, ~1e-6 relative), and
# 6 steps cannot grow that past 1e-4; the weights are not compared element by element:
# attn.k.bias has no true gradient (softmax ignores a shift of every score), so its gradient
# is rounding noise, and AdamW moves it by ~lr whatever that noise is.
python3 - "$(dirname "${BASH_SOURCE[0]}")/../../apps/data" "$tmp/text.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from make_text_corpus import write_safetensors
text = lambda lines, salt: "".join(f"def f{(i * 7 + salt) % 13}(x):\n    return x + {i % 5}\n" for i in range(lines))
write_safetensors(sys.argv[2], [("train", text(60, 0).encode()), ("heldout", text(8, 3).encode())],
                  {"tokens.format": "belay.tokens.v1", "tokens.vocab": "256"})
PY
gpt=(--model gpt --data "$tmp/text.safetensors" --layers 1 --width 16 --heads 2 --context 8 --batch 8 --steps 6
     --eval-every 3 --eval-windows 4 --seed 3)
two_only=()
if run_pair gpt "${gpt[@]}"; then
  diff <(belt_columns "$tmp/gpt.one.csv") <(belt_columns "$tmp/gpt.two.csv") >/dev/null &&
    pass "gpt: 2 ranks = 1 process: step/lr/skip/scale columns identical" || fail "gpt: belt columns differ"
  worst=$(paste -d, "$tmp/gpt.one.csv" "$tmp/gpt.two.csv" | awk -F, 'NR > 1 {
      for (c = 3; c <= 9; c += 1) { if (c != 3 && c != 5 && c != 9 || $c == "") continue
        d = ($c - $(c + 9)) / $c; if (d < 0) d = -d; if (d > w) w = d } }
      END { printf "%.3g", w }')
  awk -v w="$worst" 'BEGIN { exit !(w <= 1e-4) }' && pass "gpt: norm, loss and held-out loss within 1e-4 relative (worst $worst)" ||
    fail "gpt: norm, loss or held-out loss differ by $worst relative"
  [ "$(awk -F, 'NR > 1 && $9 != ""' "$tmp/gpt.two.csv" | wc -l)" -eq 2 ] && pass "gpt: 2 held-out evaluations logged" ||
    fail "gpt: held-out column: $(cut -d, -f9 "$tmp/gpt.two.csv" | tr '\n' ' ')"
fi

# 5. Usage errors stop every rank before any work, said once (whole), exit 2 on every rank.
expect_mpirun_error "batch 33 on 2 ranks" 2 'not a multiple of the world size 2' 2 "$belay" train --dist mpi --batch 33 --steps 1
expect_mpirun_error "mpirun without --dist mpi" 2 'started by mpirun with 2 processes but without --dist mpi' \
  2 "$belay" train --steps 1 --csv "$tmp/twice.csv"
[ ! -e "$tmp/twice.csv" ] && pass "mpirun without --dist mpi: nothing written" || fail "mpirun without --dist mpi wrote a CSV"
expect_mpirun_error "inject-rank out of range" 2 '--inject-rank 2 is not a rank' 2 "$belay" train --dist mpi --inject-rank 2 --steps 1
# A usage error that only rank 1 meets (its own BELAY_CPU_ISA): rank 0 has nothing to say
# and waits in the first collective; rank 1 waits 10 s for a rank 0 that would speak for it,
# then says it, naming itself, and mpirun ends the job.
expect_mpirun_error "a usage error on rank 1 alone" 2 'rank 1: BELAY_CPU_ISA: unknown cpu isa' \
  1 "$belay" train --dist mpi --steps 1000 : -np 1 env BELAY_CPU_ISA=bogus "$belay" train --dist mpi --steps 1000
# An option CLI11 itself refuses, before belay's own checks: said once too.
expect_mpirun_error "unknown option on 2 ranks" 2 'The following argument was not expected: --no-such-option' \
  2 "$belay" train --dist mpi --no-such-option --steps 1


# 6. Buckets: gradients cut into many buckets (each started from backward's hook) give the
# same bits as one bucket per step: the bucket an element travels in does not change how it
# is summed. An MLP of 4 layers; 0.05 MB buckets hold at most 13107 FP32 elements, so its
# 128 x 128 weights (16384) travel alone and the step needs several buckets.
bucket_pair() {  # NAME ARGS...: --bucket-mb 0 (one bucket) against --bucket-mb 0.05
  local name=$1
  shift
  for mb in 0 0.05 0.05pt; do
    mpi 2 "$belay" train --dist mpi --bucket-mb ${mb%pt} $([ "$mb" = 0.05pt ] && echo --dist-progress-thread) \
      --csv "$tmp/$name.$mb.csv" --checkpoint "$tmp/$name.$mb.ckpt" "$@" \
      >"$tmp/$name.$mb.out" 2>&1 || { fail "$name: --bucket-mb $mb failed: $(cat "$tmp/$name.$mb.out")"; return 1; }
  done
  # pt: the same with the progress thread testing the buckets in flight.
  for mb in 0.05 0.05pt; do
    if "$compare" "$tmp/$name.0.ckpt" "$tmp/$name.$mb.ckpt" 0 >"$tmp/cmp" 2>&1 &&
      cmp -s "$tmp/$name.0.csv" "$tmp/$name.$mb.csv"; then
      pass "$name: many buckets$([ "$mb" = 0.05pt ] && echo ' with the progress thread') = one bucket, bit for bit (weights, moments, scaler, the whole CSV)"
    else
      fail "$name: many buckets ($mb) differ from one"
      cat "$tmp/cmp"
    fi
  done
  # Counted, not timed: how many buckets, and that the hook started them while backward ran.
  local one many during
  one=$(sed -n 's/^dist mpi: \([0-9]*\) buckets.*/\1/p' "$tmp/$name.0.out")
  many=$(sed -n 's/^dist mpi: \([0-9]*\) buckets.*/\1/p' "$tmp/$name.0.05.out")
  during=$(sed -n 's/^dist mpi: [0-9]* buckets .*(\([0-9]*\) started during backward.*/\1/p' "$tmp/$name.0.05.out")
  if [ "$one" = "$steps" ] && [ -n "$many" ] && [ "$many" -gt $((2 * steps)) ] && [ "${during:-0}" -gt 0 ]; then
    pass "$name: $one buckets with one per step, $many with 0.05 MB ($during started during backward)"
  else
    fail "$name: bucket counts one=$one many=$many during=$during: $(grep '^dist' "$tmp/$name.0.05.out")"
  fi
  grep -q "^dist mpi: 2 ranks; per rank $steps gradient all-reduces" "$tmp/$name.0.05.out" &&
    pass "$name: $steps gradient syncs per rank (none on the earlier micro-batches)" ||
    fail "$name: sync count: $(grep '^dist' "$tmp/$name.0.05.out")"
}
steps=12
bucket_pair buckets_fp32 --model mlp --in 64 --hidden 128 --layers 4 --dtype fp32 --steps $steps --batch 32 --seed 3 --clip 0.5
# FP16 gradient buffers (widened to FP32 in each bucket, rounded back once), accumulation of
# 2 micro-batches (the sync on the last alone) and an overflow the belts must agree on.
bucket_pair buckets_fp16 --model mlp --in 64 --hidden 128 --layers 4 --dtype fp16 --grad-dtype compute \
  --steps $steps --batch 32 --micro-batch 8 --seed 5 --growth-interval 2 --spike 6:1e4
bucket_pair buckets_bf16 --model mlp --in 64 --hidden 128 --layers 4 --dtype bf16 --steps $steps --batch 32 \
  --micro-batch 8 --seed 4

# 6b. One rank (mpirun -np 1 --dist mpi) is one process, to the bit: the sum over one rank
# is the gradient itself (FP16 gradient buffers too), the agreed norm is the rank's own.
one_rank=(--model mlp --in 64 --hidden 128 --layers 4 --steps 10 --batch 32 --dtype fp16 --grad-dtype compute --seed 2)
"$belay" train "${one_rank[@]}" --csv "$tmp/np0.csv" --checkpoint "$tmp/np0.ckpt" --quiet >"$tmp/out" 2>&1 &&
  mpi 1 "$belay" train --dist mpi "${one_rank[@]}" --bucket-mb 0.05 --csv "$tmp/np1.csv" --checkpoint "$tmp/np1.ckpt" \
    >>"$tmp/out" 2>&1 || fail "one rank: $(cat "$tmp/out")"
if "$compare" "$tmp/np0.ckpt" "$tmp/np1.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$tmp/np0.csv" "$tmp/np1.csv"; then
  pass "one rank under mpirun = one process, bit for bit (weights, moments, scaler, the whole CSV)"
else
  fail "one rank under mpirun differs from one process"
  cat "$tmp/cmp"
fi

# 7. A rank that dies or hangs: the run stops within a bounded time (timeout below is the
# bound, far above what is needed, not a measurement), exits non-zero and says why, and the
# last checkpoint resumes to the same bits as a run that was never interrupted.
# children PID: its child processes (from /proc: no procps needed).
children() {
  local d
  for d in /proc/[0-9]*; do [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"; done
}
# rank_pid MPIRUN_PID RANK: the process of that rank (a child of mpirun on one machine).
rank_pid() {
  local p
  for p in $(children "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
}
failure_case() {  # NAME SIGNAL EXPECTED-STDERR-PATTERN DIST-TIMEOUT
  local name=$1 sig=$2 want=$3 dist_timeout=$4 mp victim rc rows kstop
  rm -f "$tmp/$name.ckpt" "$tmp/$name.csv"
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$belay" train --dist mpi "${kill_run[@]}" "${kill_extra[@]}" \
    --dist-timeout "$dist_timeout" --checkpoint "$tmp/$name.ckpt" --checkpoint-every 3 --csv "$tmp/$name.csv" --quiet \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  mp=$!
  for _ in $(seq 600); do [ -f "$tmp/$name.ckpt" ] && [ "$(wc -l <"$tmp/$name.csv")" -gt 8 ] && break; sleep 0.1; done
  # timeout is mpirun's parent: mpirun is timeout's child, the ranks are mpirun's.
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
  # A stopped rank left behind by a failed test (only if that pid is still our rank 1).
  tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && kill -KILL "$victim" 2>/dev/null
  # belay's own line is checked whole (outside mpirun's banners); mpirun's words are in them.
  local lines=cat
  [[ "$want" == '^belay: '* ]] && lines=belay_lines
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && $lines "$tmp/$name.err" | grep -q "$want"; then
    pass "$name: stopped, exit $rc: $($lines "$tmp/$name.err" | grep -m1 "$want")"
  else
    fail "$name: exit $rc (124: still running at the bound), stderr: $(cat "$tmp/$name.err")"
  fi
  # Resume on 2 ranks a little past what the stopped run logged; the same steps in one go.
  rows=$(($(wc -l <"$tmp/$name.csv") - 1))
  kstop=$((rows + 4))
  mpi 2 "$belay" train --dist mpi "${kill_run[@]}" "${kill_extra[@]}" --stop-at $kstop --resume "$tmp/$name.ckpt" \
    --checkpoint "$tmp/$name.ckpt" --csv "$tmp/$name.csv" --quiet >"$tmp/out" 2>&1 || fail "$name: resume: $(cat "$tmp/out")"
  mpi 2 "$belay" train --dist mpi "${kill_run[@]}" "${kill_extra[@]}" --stop-at $kstop --checkpoint "$tmp/$name.whole.ckpt" \
    --csv "$tmp/$name.whole.csv" --quiet >"$tmp/out" 2>&1 || fail "$name: uninterrupted run: $(cat "$tmp/out")"
  if "$compare" "$tmp/$name.whole.ckpt" "$tmp/$name.ckpt" 0 >"$tmp/cmp" 2>&1 && cmp -s "$tmp/$name.whole.csv" "$tmp/$name.csv"; then
    pass "$name: the last checkpoint resumed to step $kstop, bit for bit an uninterrupted run (weights and CSV)"
  else
    fail "$name: resume after the failure differs from an uninterrupted run"
    cat "$tmp/cmp"
  fi
}
kill_run=(--model mlp --in 256 --hidden 512 --steps 100000 --seed 9)
kill_extra=()
# SIGKILL: mpirun itself sees the rank die and ends the job (OpenMPI's own handling); the
# deadline stays long, so a loaded CI machine cannot end the run before the kill.
failure_case kill9 KILL 'exited on signal 9' 60
# SIGSTOP: the rank hangs without dying; its peer gives up after --dist-timeout 2 with one
# line of its own, and MPI_Abort ends every rank (the stopped one too). (On a machine loaded
# enough to stall a rank 2 s before the stop, the run ends the same way, with the same line.)
failure_case hang STOP '^belay: error: rank 0: no answer from the other ranks for 2 s in ' 2
# The same with sharded optimizer state (--shard-optimizer): its checkpoint is gathered from
# the owners to rank 0 before the write, so a rank lost mid-run never leaves it half written,
# and every wait of the sharded path (the reduce, the parameters' broadcast) has the deadline.
kill_extra=(--shard-optimizer)
failure_case kill9.sharded KILL 'exited on signal 9' 60
failure_case hang.sharded STOP '^belay: error: rank 0: no answer from the other ranks for 2 s in ' 2
kill_extra=()

# 8. Option errors of the distributed path: one line, exit 2, on every rank alike.
for bad in "--bucket-mb -1" "--dist-timeout 0" "--bucket-mb nan"; do
  expect_mpirun_error "$bad" 2 "${bad%% *}" 2 "$belay" train --dist mpi $bad --steps 1
done

# 9. --dist nccl where no GPU is visible (or belay has no NCCL): a clean stop on every rank,
# said once, never a crash. Where a GPU exists, bench/gpu-check.sh runs NCCL for real.
if "$belay" info | grep -q 'cuda built: [1-9]'; then
  echo "skip --dist nccl failure check: a GPU is visible (bench/gpu-check.sh runs NCCL)"
else
  mpi 2 "$belay" train --dist nccl --device cuda --steps 1 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if { [ $rc -eq 2 ] || [ $rc -eq 1 ]; } && [ "$(belay_lines "$tmp/err" | wc -l)" -eq 1 ] &&
    belay_lines "$tmp/err" | grep -q '^belay: error: ' && ! grep -qi 'signal\|segmentation\|core dumped' "$tmp/err"; then
    pass "--dist nccl without a GPU, 2 ranks: exit $rc, $(belay_lines "$tmp/err")"
  else
    fail "--dist nccl without a GPU: exit $rc, $(cat "$tmp/err")"
  fi
fi

[ $fails -eq 0 ] && echo "dist: all passed" || echo "dist: $fails failed"
exit $((fails > 0))
