#!/usr/bin/env bash
# The CLI as a user meets it: exit codes, one-line errors, files written or not.
# Usage: cli_test.sh path/to/belay
set -u
belay=$1
. "$(dirname "${BASH_SOURCE[0]}")/../../shell_test_lib.sh"

# expect_error NAME EXIT_CODE ARGS...: stderr is exactly one line starting "belay: error: ".
expect_error() {
  local name=$1 code=$2
  shift 2
  expect_one_line_error "$name" "$code" "" "$@"
}

expect_error "zero steps" 2 train --steps 0
expect_error "negative steps" 2 train --steps -3
expect_error "more steps than the device count holds" 2 train --steps 16777217
expect_error "zero batch" 2 train --batch 0
expect_error "negative in" 2 train --in -1
expect_error "zero out" 2 train --out 0
expect_error "non-numeric steps" 2 train --steps many
expect_error "unknown dtype" 2 train --dtype fp8
# A warmup the schedule would ignore, or one as long as the run, is refused.
expect_one_line_error "warmup as long as the run" 2 "--warmup 500 is as long as the run (--steps 10)" \
  train --schedule cosine --warmup 500 --steps 10
expect_one_line_error "warmup equal to the run" 2 "--warmup 10 is as long as the run" train --schedule cosine --warmup 10 --steps 10
expect_one_line_error "warmup without the cosine schedule" 2 "--warmup 5 needs --schedule cosine" train --warmup 5 --steps 10
expect_error "unknown model" 2 train --model transformer
# An option of another model kind is refused naming both (apps/run/model_kinds.h), not ignored,
# before any file is read (with or without a tokens file beside the executable).
expect_one_line_error "an MLP's option given to a GPT" 2 "--in is not an option of --model gpt" train --model gpt --in 4
expect_one_line_error "a GPT's option given to the Linear model" 2 "--heads is not an option of --model linear" \
  train --heads 2 --steps 1
# --print-config: the options as the run takes them, the model kind's defaults filled in.
if "$belay" train --model gpt --print-config | grep -qx "steps=1500"; then pass "--print-config shows the GPT's defaults"
else fail "--print-config"; fi
expect_error "unknown device" 2 train --device tpu
# Only where no CUDA device is there: a GPU, or the emulated one of a BELAY_CUDA_EMULATION
# build, trains (tests/emulation/train_cli.sh runs that).
if "$belay" --version 2>/dev/null | grep -qE "cuda (built|emulated on the CPU[^:]*): [1-9]"; then
  pass "cuda present: no no-GPU error expected"
else
  expect_error "cuda without a GPU or CUDA build" 2 train --device cuda --steps 1
fi
expect_error "a second GPU (one GPU per process so far)" 2 train --device cuda:1 --steps 1
expect_error "unknown optimizer" 2 train --optimizer lion
expect_error "unknown schedule" 2 train --schedule step
expect_error "bad spike" 2 train --spike 12
expect_error "bad clip" 2 train --clip 0
expect_error "negative lr" 2 train --lr -1
expect_error "unknown subcommand" 2 fly
expect_error "unknown option" 2 train --frobnicate
expect_error "bad finfo value" 2 finfo abc
expect_error "unknown scenario" 2 train --scenario nope
expect_error "bad grad dtype" 2 train --grad-dtype fp64
expect_error "bad growth factor" 2 train --dtype fp16 --growth-factor 0.5
expect_error "unknown cpu isa" 2 --cpu-isa sse9 info
expect_error "unknown cpu isa after the subcommand" 2 train --steps 1 --cpu-isa avx3
BELAY_CPU_ISA=sse9 expect_error "unknown BELAY_CPU_ISA" 2 train --steps 1
# The CPU ISA paths: the line `belay info` prints, forcing baseline, and a path the CPU lacks.
isa_line=$("$belay" info | grep '^cpu isa: ')
[ -n "$isa_line" ] && pass "info prints '$isa_line'" || fail "info has no 'cpu isa:' line"
"$belay" --cpu-isa baseline info | grep -q '^cpu isa: baseline (cpu has: ' && pass "--cpu-isa baseline" ||
  fail "--cpu-isa baseline"
BELAY_CPU_ISA=baseline "$belay" info | grep -q '^cpu isa: baseline ' && pass "BELAY_CPU_ISA=baseline" ||
  fail "BELAY_CPU_ISA=baseline"
# The GEMM blocking of the path in use and the caches it came from (kernels/cpu/gemm_blocking.h).
"$belay" info | grep -Eq '^cpu gemm: .*: MR [0-9]+ NR [0-9]+ KC [0-9]+ MC [0-9]+ NC [0-9]+(, an A panel in L1 where a slice is NC / 2 wide)?(; MR 8 NR 48 where N fills it)?; caches L1d ' &&
  pass "info prints the gemm blocking" || fail "info has no 'cpu gemm:' line with the blocking and caches"
# The AVX-512 paths' wide micro-tile, and BELAY_GEMM_TILE=narrow turning it off.
if grep -q 'avx512f' <<<"$isa_line"; then
  "$belay" --cpu-isa avx512 info | grep -q '^cpu gemm: avx512: .*; MR 8 NR 48 where N fills it; caches' &&
    pass "the wide tile on avx512" || fail "--cpu-isa avx512: no wide tile in the gemm line"
  BELAY_GEMM_TILE=narrow "$belay" --cpu-isa avx512 info | grep -q 'where N fills it' &&
    fail "BELAY_GEMM_TILE=narrow still reports the wide tile" || pass "BELAY_GEMM_TILE=narrow"
fi
"$belay" --cpu-isa avx2 info 2>/dev/null | grep -q 'where N fills it' && fail "avx2 reports a wide tile" ||
  pass "no wide tile off AVX-512"
BELAY_GEMM_TILE=square expect_error "unknown BELAY_GEMM_TILE" 2 info
BELAY_HUGE_PAGES=maybe expect_error "unknown BELAY_HUGE_PAGES" 2 train --steps 1
"$belay" --cpu-isa baseline info | grep -q '^cpu gemm: baseline: MR 6 NR 8 KC ' && pass "gemm blocking of baseline" ||
  fail "--cpu-isa baseline: the gemm line names another path"
BELAY_GEMM_BLOCKING=fixed "$belay" info | grep -q '^cpu gemm: .*(fixed: BELAY_GEMM_BLOCKING)' &&
  pass "BELAY_GEMM_BLOCKING=fixed" || fail "BELAY_GEMM_BLOCKING=fixed not reported"
BELAY_GEMM_BLOCKING=sideways expect_error "unknown BELAY_GEMM_BLOCKING" 2 info
if ! grep -q 'avx512f' <<<"$isa_line"; then
  expect_error "avx512 on a CPU without it" 2 --cpu-isa avx512 info
  BELAY_CPU_ISA=avx512 expect_error "BELAY_CPU_ISA=avx512 on a CPU without it" 2 train --steps 1
fi

# An unwritable CSV path: exit 2 before any work, and no file (not even a partial one) left.
expect_error "unwritable csv" 2 train --steps 5 --csv "$tmp/no/such/dir/run.csv"
if [ ! -e "$tmp/no/such/dir/run.csv" ]; then pass "no partial csv"; else fail "a csv was left behind"; fi
mkdir "$tmp/ro" && chmod 500 "$tmp/ro"
if [ "$(id -u)" -ne 0 ]; then expect_error "read-only directory" 2 train --steps 5 --csv "$tmp/ro/run.csv"; fi

# --help and --version succeed.
"$belay" --help >/dev/null && pass "--help" || fail "--help"
"$belay" --version | grep -q '^belay ' && pass "--version" || fail "--version"
"$belay" train --help | grep -q -- '--inject-inf' && pass "train --help lists --inject-inf" || fail "train --help"

# The 200-step run: a header plus 200 rows, with exactly the canonical header.
if "$belay" train --steps 200 --csv "$tmp/run.csv" --quiet; then
  header=$(head -1 "$tmp/run.csv")
  rows=$(($(wc -l <"$tmp/run.csv") - 1))
  [ "$header" = "step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale" ] &&
    pass "csv header" || fail "csv header: $header"
  [ "$rows" -eq 200 ] && pass "200 csv rows" || fail "csv rows: $rows"
else
  fail "200-step run failed"
fi

# The README demo: fp16, an inf at step 5, STEP/SKIP rows, the skip at step 5 only.
out=$("$belay" train --dtype fp16 --steps 30 --inject-inf 5 --show-steps --csv "$tmp/demo.csv")
echo "$out" | grep -q '^SKIP     5 .*nonfinite_grad' && pass "demo shows SKIP at step 5" || fail "demo SKIP row"
[ "$(echo "$out" | grep -c '^STEP ')" -eq 29 ] && pass "demo shows 29 STEP rows" || fail "demo STEP rows"
awk -F, 'NR>1 && $6==1 {print $1}' "$tmp/demo.csv" | tr '\n' ' ' | grep -qx '5 ' && pass "demo csv skips only step 5" ||
  fail "demo csv skips: $(awk -F, 'NR>1 && $6==1 {print $1}' "$tmp/demo.csv" | tr '\n' ' ')"
# bf16: no loss scaling, still skips the injected step only.
"$belay" train --dtype bf16 --steps 30 --inject-inf 5 --quiet --csv "$tmp/bf16.csv"
[ "$(awk -F, 'NR>1 && $6==1 {print $1}' "$tmp/bf16.csv" | tr '\n' ' ')" = "5 " ] && pass "bf16 skips only step 5" ||
  fail "bf16 skips"

# The skip-rate stop: every step skipped, stop after 3 consecutive steps above 50%.
"$belay" train --steps 20 --inject-inf 0 --inject-inf 1 --inject-inf 2 --inject-inf 3 --inject-inf 4 \
  --max-skip-rate 0.5 --skip-patience 3 --quiet >"$tmp/stop.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'skip rate stayed above' "$tmp/stop.out" && pass "skip-rate stop exits 1" ||
  fail "skip-rate stop: exit $rc"

# Accumulation: B not a multiple of b is bad input; accum-check passes and shows the bug.
expect_error "batch not a multiple of micro-batch" 2 train --batch 30 --micro-batch 8
if "$belay" accum-check >"$tmp/accum.out"; then
  grep -q 'without 1/accum_steps' "$tmp/accum.out" && grep -q '4.00x' "$tmp/accum.out" && pass "accum-check passes, shows the 4x error" ||
    fail "accum-check output: $(cat "$tmp/accum.out")"
else
  fail "accum-check failed: $(cat "$tmp/accum.out")"
fi
# sweep writes valid JSON with one point per accum value.
if "$belay" sweep --micro-batch 4 --accum 1,2,4 --steps 5 --json "$tmp/sweep.json" >/dev/null &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [p["accum"] for p in d["points"]]==[1,2,4]; assert all(p["sync_calls"]==5 for p in d["points"])' "$tmp/sweep.json"; then
  pass "sweep writes valid JSON"
else
  fail "sweep JSON"
fi
expect_error "sweep to an unwritable path" 2 sweep --accum 1 --steps 1 --json "$tmp/no/dir/s.json"
expect_error "sweep with accum 0" 2 sweep --accum 0 --steps 1

# Checkpoints: stop, resume with other settings (exit 2, nothing overwritten), resume right.
"$belay" train --steps 30 --stop-at 10 --checkpoint "$tmp/c.safetensors" --csv "$tmp/c.csv" --quiet
before=$(md5sum <"$tmp/c.safetensors")
expect_error "resume with another lr" 2 train --steps 30 --lr 0.5 --resume "$tmp/c.safetensors" --checkpoint "$tmp/c.safetensors"
[ "$(md5sum <"$tmp/c.safetensors")" = "$before" ] && pass "checkpoint not overwritten" || fail "checkpoint overwritten"
head -c 100 "$tmp/c.safetensors" >"$tmp/trunc.safetensors"
expect_error "resume from a truncated file" 2 train --steps 30 --resume "$tmp/trunc.safetensors"
expect_error "resume from a missing file" 2 train --steps 30 --resume "$tmp/none.safetensors"
# A checkpoint of the first synthetic-data generator (written by belay at 2ffea34 on the avx2
# path with `belay train --steps 10 --checkpoint F`): its batches cannot be continued, said
# in one line. On the baseline path: the other-path warning must not come first.
expect_error "resume a version-1 data checkpoint" 2 --cpu-isa baseline train --steps 20 \
  --resume "$(dirname "${BASH_SOURCE[0]}")/fixtures/data-v1-checkpoint.safetensors"
"$belay" train --steps 30 --resume "$tmp/c.safetensors" --csv "$tmp/c.csv" --quiet
[ "$(($(wc -l <"$tmp/c.csv") - 1))" -eq 30 ] && pass "resumed csv has 30 rows" || fail "resumed csv rows"
# The same run on 1 and 3 threads: the same log and the same weights, bit for bit (every
# reduction and product sums in an order that does not depend on the thread count).
for t in 1 3; do
  OMP_NUM_THREADS=$t "$belay" train --model mlp --in 256 --hidden 512 --steps 6 --dtype fp16 \
    --csv "$tmp/thr$t.csv" --checkpoint "$tmp/thr$t.safetensors" --quiet
done
cmp -s "$tmp/thr1.csv" "$tmp/thr3.csv" && cmp -s "$tmp/thr1.safetensors" "$tmp/thr3.safetensors" &&
  pass "1 and 3 threads: identical log and checkpoint" || fail "1 and 3 threads differ"
# The checkpoint records the CPU path that wrote it; a resume on another path says so (the
# bits may differ in the last place), on the same path it does not.
"$belay" --cpu-isa baseline train --steps 4 --stop-at 2 --checkpoint "$tmp/isa.safetensors" --quiet
grep -aq '"cpu_isa":"baseline"' "$tmp/isa.safetensors" && pass "checkpoint records cpu_isa" || fail "no cpu_isa in the checkpoint"
"$belay" --cpu-isa baseline train --steps 4 --resume "$tmp/isa.safetensors" --quiet 2>"$tmp/err" &&
  ! grep -q "CPU path" "$tmp/err" && pass "same-path resume: no warning" || fail "same-path resume: $(cat "$tmp/err")"
best_isa=$("$belay" info | sed -n 's/^cpu isa: \([a-z0-9]*\) .*/\1/p')
if [ "$best_isa" != baseline ]; then
  "$belay" train --steps 4 --resume "$tmp/isa.safetensors" --quiet 2>"$tmp/err" &&
    grep -q "written by the baseline CPU path, this run uses $best_isa" "$tmp/err" &&
    pass "resume on $best_isa warns" || fail "resume on $best_isa: $(cat "$tmp/err")"
fi
"$belay" export --checkpoint "$tmp/c.safetensors" --out "$tmp/w.safetensors" >/dev/null && pass "export" || fail "export"
expect_error "export from a non-checkpoint" 2 export --checkpoint "$tmp/c.csv" --out "$tmp/w2.safetensors"

# SIGINT and SIGTERM: finish the step, checkpoint, close the log, exit 130 / 143.
for sig in INT TERM; do
  rm -f "$tmp/s.safetensors" "$tmp/s.csv"
  "$belay" train --model mlp --in 256 --hidden 512 --steps 100000 --checkpoint "$tmp/s.safetensors" \
    --csv "$tmp/s.csv" --quiet &
  pid=$!
  for _ in $(seq 100); do [ -f "$tmp/s.csv" ] && [ "$(wc -l <"$tmp/s.csv")" -gt 3 ] && break; sleep 0.1; done
  kill -$sig $pid
  wait $pid
  rc=$?
  want=$([ $sig = INT ] && echo 130 || echo 143)
  rows=$(($(wc -l <"$tmp/s.csv") - 1))
  last=$(tail -1 "$tmp/s.csv" | cut -d, -f1)
  if [ $rc -eq "$want" ] && [ -s "$tmp/s.safetensors" ] && [ "$last" -eq $((rows - 1)) ]; then
    pass "SIG$sig: exit $rc, checkpoint written, $rows complete rows"
    # The checkpoint continues the run where the log stopped.
    "$belay" train --model mlp --in 256 --hidden 512 --steps $((rows + 2)) --resume "$tmp/s.safetensors" --quiet \
      --csv "$tmp/s.csv" 2>"$tmp/err"
    [ "$(($(wc -l <"$tmp/s.csv") - 1))" -eq $((rows + 2)) ] && pass "SIG$sig: resumed" || fail "SIG$sig resume: $(cat "$tmp/err")"
  else
    fail "SIG$sig: exit $rc (want $want), rows $rows, last $last"
  fi
done

# kill -9: every completed row is in the log (whole lines, 8 fields), the last checkpoint is
# intact, and resuming from it continues the run.
rm -f "$tmp/k.safetensors" "$tmp/k.csv"
"$belay" train --model mlp --in 256 --hidden 512 --steps 100000 --checkpoint "$tmp/k.safetensors" \
  --checkpoint-every 3 --csv "$tmp/k.csv" --quiet &
pid=$!
for _ in $(seq 100); do [ -f "$tmp/k.csv" ] && [ "$(wc -l <"$tmp/k.csv")" -gt 8 ] && break; sleep 0.1; done
kill -9 $pid
wait $pid 2>/dev/null
if awk -F, 'NR>1 && (NF!=8 || $1!=NR-2) {bad=1} END {exit bad}' "$tmp/k.csv" && [ "$(tail -c1 "$tmp/k.csv" | od -An -c | tr -d ' ')" = '\n' ]; then
  pass "kill -9: $(($(wc -l <"$tmp/k.csv") - 1)) whole rows in the log"
else
  fail "kill -9 left a broken log"
fi
# Stop a little past the last row the killed run wrote (how far it got depends on the CPU's
# speed: an AVX-512 machine gets further than 40 steps in the time above).
kstop=$(($(wc -l <"$tmp/k.csv") - 1 + 10))
if "$belay" train --model mlp --in 256 --hidden 512 --steps 100000 --stop-at $kstop --resume "$tmp/k.safetensors" \
  --csv "$tmp/k.csv" --quiet && [ "$(tail -1 "$tmp/k.csv" | cut -d, -f1)" = $((kstop - 1)) ] &&
  awk -F, 'NR>1 && $1!=NR-2 {bad=1} END {exit bad}' "$tmp/k.csv"; then
  pass "kill -9: the last checkpoint resumes, the log reads as one run"
else
  fail "kill -9: resume from the last checkpoint"
fi

# Clipping by value (--clip-mode value): the cosine in the summary.
expect_error "clip by value without a bound" 2 train --clip-mode value --steps 1
expect_error "unknown clip mode" 2 train --clip-mode angle --clip 1 --steps 1
if "$belay" train --steps 5 --clip 0.01 --clip-mode value >"$tmp/cv.out" 2>&1 &&
  grep -qE '^clipping \(value at 0.01\): 5 of 5 applied steps clipped; cosine\(raw, applied gradient\) min 0\.[0-9]+, mean 0\.[0-9]+' "$tmp/cv.out" &&
  "$belay" train --steps 5 --clip 0.01 | grep -q '^clipping (norm at 0.01): 5 of 5 applied steps clipped; cosine(raw, applied gradient) 1 '; then
  pass "clip modes: value turns the gradient (cosine < 1), norm keeps its direction"
else
  fail "clip modes: $(cat "$tmp/cv.out")"
fi
# Scale diagnostics: the summary line, the repeated-backoff warning and the min-scale warning.
"$belay" train --dtype fp16 --steps 12 --inject-inf 3 --inject-inf 5 --min-scale 16384 --inject-inf 8 >"$tmp/sd.out" 2>&1
if grep -q '^scale: min 16384, max 65536, 2 backoffs, 0 growths$' "$tmp/sd.out" &&
  grep -q '^warning: the loss scale backed off 2 times within one growth interval (2000 steps, from step 3 to 5)' "$tmp/sd.out" &&
  grep -q '^warning: the loss scale reached --min-scale 16384 at step 5' "$tmp/sd.out"; then
  pass "scale diagnostics: min/max/backoffs/growths and both warnings"
else
  fail "scale diagnostics: $(cat "$tmp/sd.out")"
fi
# belay plot: SVG well formed (Python's XML parser), PNG through rsvg-convert, overlay, errors.
"$belay" train --dtype fp16 --steps 30 --inject-inf 5 --csv "$tmp/amp.csv" --quiet
"$belay" train --steps 30 --inject-inf 5 --csv "$tmp/fp32.csv" --quiet
if "$belay" plot "$tmp/amp.csv" >/dev/null && [ -s "$tmp/amp.svg" ] &&
  python3 -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); assert r.tag.endswith("svg"), r.tag' "$tmp/amp.svg"; then
  pass "plot: the default output is a well-formed SVG"
else
  fail "plot: SVG"
fi
if command -v rsvg-convert >/dev/null; then
  if "$belay" plot "$tmp/fp32.csv" "$tmp/amp.csv" -o "$tmp/both.png" >/dev/null &&
    [ "$(head -c 8 "$tmp/both.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
    rsvg-convert -o "$tmp/check.png" "$tmp/amp.svg"; then
    pass "plot: two logs overlaid as PNG; rsvg-convert renders the SVG"
  else
    fail "plot: PNG"
  fi
else
  fail "plot: rsvg-convert missing (third_party/install_deps.sh installs librsvg2-bin)"
fi
# Every file written atomically names the path the user gave when it cannot be written,
# never its temporary, and leaves nothing behind.
for ext in svg png; do
  expect_one_line_error "plot -o into a missing folder ($ext)" 2 "cannot write '$tmp/nodir/p.$ext': No such file or directory (its folder '$tmp/nodir' does not exist)\$" \
    plot "$tmp/amp.csv" -o "$tmp/nodir/p.$ext"
done
"$belay" train --steps 2 --checkpoint "$tmp/ck.ckpt" --quiet
expect_one_line_error "export into a missing folder" 2 "cannot write '$tmp/nodir/w.safetensors': No such file" \
  export --checkpoint "$tmp/ck.ckpt" --out "$tmp/nodir/w.safetensors"
expect_one_line_error "validate --json into a missing folder" 2 "cannot write '$tmp/nodir/v.json': No such file" \
  validate --json "$tmp/nodir/v.json"
expect_one_line_error "train --checkpoint into a missing folder" 2 "cannot write '$tmp/nodir/c.ckpt': No such file" \
  train --steps 2 --checkpoint "$tmp/nodir/c.ckpt"
[ ! -s "$tmp/out" ] && pass "train --checkpoint into a missing folder: refused before the first step" ||
  fail "train --checkpoint into a missing folder trained first: $(cat "$tmp/out")"
expect_one_line_error "train --csv into a missing folder" 2 "cannot write '$tmp/nodir/r.csv': No such file" \
  train --steps 2 --csv "$tmp/nodir/r.csv"
[ ! -e "$tmp/nodir" ] && pass "nothing written for a missing folder" || fail "something was written: $(ls -R "$tmp/nodir")"
expect_error "plot: not a step log" 2 plot "$tmp/cv.out" -o "$tmp/x.svg"
expect_error "plot: unknown picture format" 2 plot "$tmp/amp.csv" -o "$tmp/x.gif"
expect_error "plot: a missing log" 2 plot "$tmp/none.csv"
[ ! -e "$tmp/x.svg" ] && [ ! -e "$tmp/x.gif" ] && pass "plot: nothing written on an error" || fail "plot: wrote on an error"
PATH=/nonexistent "$belay" plot "$tmp/amp.csv" -o "$tmp/x.png" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^belay: error: writing a PNG needs rsvg-convert' "$tmp/err" &&
  [ ! -e "$tmp/x.png" ]; then
  pass "plot: PNG without rsvg-convert is a one-line error, nothing written"
else
  fail "plot: PNG without rsvg-convert: exit $rc, $(cat "$tmp/err")"
fi
# Rollback: a forced skip rate stops with exit 1 and the case file; the default log keeps 8 columns.
"$belay" train --dtype fp16 --steps 40 --rollback-on skip-rate --rollback-every 5 --rollback-skip-window 10 \
  --rollback-skip-rate 0.5 $(for s in $(seq 12 30); do echo --inject-inf $s; done) --csv "$tmp/rb.csv" \
  --checkpoint "$tmp/rb.safetensors" >"$tmp/rb.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^belay: error: rollback: skip-rate: 6 of the last 10 steps skipped' "$tmp/rb.out" &&
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["cases"][0]; assert (c["step"], c["restored_step"], c["action"]) == (17, 10, "stop"), c' "$tmp/rb.rollback.json" &&
  [ "$(head -1 "$tmp/rb.csv")" = "step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale" ]; then
  pass "rollback: stops with exit 1, the case in rb.rollback.json, the 8-column log"
else
  fail "rollback: exit $rc, $(cat "$tmp/rb.out")"
fi
# SGD at lr 4 diverges on this data; at 0.4 it converges.
if "$belay" train --optimizer sgd --momentum 0 --lr 4 --steps 60 --rollback-on divergence --divergence-warmup 3 \
  --rollback-policy lower-lr 0.1 --csv "$tmp/lr.csv" --quiet && [ "$(head -1 "$tmp/lr.csv" | cut -d, -f9)" = policy ] &&
  [ "$(sed -n 2p "$tmp/lr.csv" | cut -d, -f9)" = "fp32@lr=4" ] && [ "$(tail -1 "$tmp/lr.csv" | cut -d, -f1,9)" = "59,fp32@lr=0.4" ]; then
  pass "rollback: a diverging run goes on at a lower LR, the policy column says so"
else
  fail "rollback: lower-lr"
fi
expect_error "rollback: unknown condition" 2 train --rollback-on loss-spike
expect_error "rollback: lower-lr without a factor" 2 train --rollback-on skip-rate --rollback-policy lower-lr
expect_error "rollback: a policy without a condition" 2 train --rollback-policy fp32 --dtype fp16
expect_error "rollback: fp32 policy on an fp32 run" 2 train --rollback-on divergence --rollback-policy fp32
# A resume under another dtype is a new experiment, refused unless asked for.
"$belay" train --dtype fp16 --steps 10 --stop-at 5 --checkpoint "$tmp/ne.safetensors" --quiet
expect_error "resume under another dtype" 2 train --dtype bf16 --steps 10 --resume "$tmp/ne.safetensors"
if "$belay" train --dtype bf16 --steps 10 --resume "$tmp/ne.safetensors" --new-experiment \
  --checkpoint "$tmp/ne2.safetensors" | grep -q "^experiment: new experiment at step 5 from '.*ne.safetensors': dtype fp16 -> bf16"; then
  pass "resume under another dtype with --new-experiment: allowed and said"
else
  fail "--new-experiment"
fi
# Resources: a model past any memory, and a checkpoint's stale temporary from a killed writer.
expect_error "a model too large to address" 2 train --in 100000000000 --out 100000000000
"$belay" train --steps 2 --checkpoint "$tmp/t.safetensors" --quiet
(exit 0) & dead=$!
wait $dead
echo partial >"$tmp/t.safetensors.tmp.$dead.0"
"$belay" train --steps 4 --resume "$tmp/t.safetensors" --checkpoint "$tmp/t.safetensors" --quiet
[ ! -e "$tmp/t.safetensors.tmp.$dead.0" ] && pass "a killed writer's temporary is removed at the next write" ||
  fail "stale checkpoint temporary left"
# validate: the default set passes in fp16 and bf16, the thresholds printed before the scores.
for dt in fp16 bf16; do
  if "$belay" validate --dtype $dt --json "$tmp/v_$dt.json" >"$tmp/v.out" 2>&1 &&
    awk '/thresholds \(fixed before the runs\)/ {t=NR} /scores per output/ {s=NR} END {exit !(t && s && t < s)}' "$tmp/v.out" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pass"] is True and d["comparison"]["decisions"]["changed"]==0' "$tmp/v_$dt.json"; then
    pass "validate $dt passes its default set (thresholds first, JSON written)"
  else
    fail "validate $dt: $(cat "$tmp/v.out")"
  fi
done
# A set with one input of 1e5 (row 5) and one with a NaN (row 9): safetensors by hand.
write_set() {  # PATH ROW VALUE
  python3 - "$@" <<'PY'
import json, math, random, struct, sys
path, row, value = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
random.seed(3)
x = [random.gauss(0, 1) for _ in range(24 * 16)]
x[row * 16 + 2] = value
xb = struct.pack('<%df' % len(x), *x)
yb = struct.pack('<24q', *[i % 4 for i in range(24)])
h = json.dumps({"x": {"dtype": "F32", "shape": [24, 16], "data_offsets": [0, len(xb)]},
                "y": {"dtype": "I64", "shape": [24], "data_offsets": [len(xb), len(xb) + len(yb)]}}).encode()
h += b' ' * (-len(h) % 8)
open(path, 'wb').write(struct.pack('<Q', len(h)) + h + xb + yb)
PY
}
write_set "$tmp/big.safetensors" 5 1e5
"$belay" validate --dtype fp16 --data "$tmp/big.safetensors" >"$tmp/v.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q '^  row    5 ' "$tmp/v.out" && grep -q 'FAIL  amp: no non-finite value' "$tmp/v.out" &&
  pass "validate: an input of 1e5 fails fp16 (exit 1, row 5 shown)" || fail "validate 1e5: exit $rc, $(cat "$tmp/v.out")"
"$belay" validate --dtype bf16 --data "$tmp/big.safetensors" | grep -q 'PASS  amp: no non-finite value' &&
  pass "validate: bf16 holds the same input" || fail "validate bf16 on 1e5"
"$belay" validate --dtype bf16 --tie-margin 0.002 >"$tmp/v.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q 'near_tie .*(near-tie)$' "$tmp/v.out" && pass "validate: a near-tie that flips fails (exit 1, row listed)" ||
  fail "validate near-tie: exit $rc"
write_set "$tmp/nan.safetensors" 9 nan
"$belay" validate --data "$tmp/nan.safetensors" >"$tmp/v.out" 2>&1
[ $? -eq 1 ] && grep -q 'FAIL  baseline: FP32 reference finite' "$tmp/v.out" && pass "validate: a NaN in the reference is a baseline failure" ||
  fail "validate baseline NaN"
# The verdict counts the rows it shows: the NaN row's AMP scores are not finite either (listed
# with the baseline's failures), so the AMP check fails and says where the row is.
grep -q '^  FAIL  amp: no non-finite value (1 rows with non-finite AMP scores, 1 of them with a non-finite reference too' \
  "$tmp/v.out" && pass "validate: the AMP check counts the NaN row it shows" ||
  fail "validate NaN row: the AMP verdict disagrees with the rows shown: $(grep 'amp: no non-finite' "$tmp/v.out")"
# A set without a kind tensor has no kind column: no made-up kind "row".
grep -q '^set: .*, 24 rows, class labels$' "$tmp/v.out" && grep -q '^  row    9 ref \[' "$tmp/v.out" &&
  ! grep -q '[0-9] row)\|row    9 row' "$tmp/v.out" && pass "validate: no kind column for a set without kinds" ||
  fail "validate: kind column on a set without kinds: $(grep -m2 '^set:\|row    9' "$tmp/v.out")"
# Tolerances: a given value is finite and >= 0; no typed value means "the default".
for opt in --rtol --atol --tie-margin; do
  expect_one_line_error "validate $opt -1" 2 "$opt must be a finite number >= 0, got -1" validate $opt -1
done
expect_one_line_error "validate --rtol nan" 2 "--rtol must be a finite number >= 0" validate --rtol nan
"$belay" validate --train 10 --rtol 0.05 >"$tmp/v.out" 2>&1 && grep -q 'fp16: 10 applied' "$tmp/v.out" &&
  pass "validate --train 10" || fail "validate --train: $(cat "$tmp/v.out")"
expect_error "validate in fp32" 2 validate --dtype fp32
expect_error "validate with an unknown fp32 op" 2 validate --fp32-ops conv
expect_error "validate with --init and --checkpoint" 2 validate --init a --checkpoint b

# train --detect-anomaly: a backward overflow stops the run (exit 1, one error line, the
# report on stdout); with loss scaling it is a scaler event and the run goes on.
"$belay" train --dtype fp16 --no-scaler --spike 3:1e8 --steps 8 --detect-anomaly >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/a.err")" -eq 1 ] && grep -q '^belay: error: anomaly at step 3: backward, mse_loss' "$tmp/a.err" &&
  grep -q '^  phase       backward' "$tmp/a.out" && pass "detect-anomaly: backward overflow named (exit 1)" ||
  fail "detect-anomaly backward: exit $rc, $(cat "$tmp/a.err")"
"$belay" train --dtype fp16 --spike 3:1e8 --steps 8 --detect-anomaly >"$tmp/a.out" 2>&1 &&
  grep -q '^scaler event' "$tmp/a.out" && grep -q '1 scaler event(s), no anomaly' "$tmp/a.out" &&
  pass "detect-anomaly: a scaled gradient's overflow is a scaler event" || fail "detect-anomaly scaler event"
write_set "$tmp/xnan.safetensors" 13 nan
# (the set's I64 labels make it a classification file: an MLP)
expect_error "a NaN in --data is refused at load" 2 train --model mlp --data "$tmp/xnan.safetensors" --batch 8 --steps 3
"$belay" train --model mlp --data "$tmp/xnan.safetensors" --batch 8 --steps 3 --detect-anomaly >"$tmp/a.out" 2>"$tmp/a.err"
[ $? -eq 1 ] && grep -q 'anomaly at step 1: input, batch, x (data row 13)' "$tmp/a.err" &&
  pass "detect-anomaly: a NaN in the data, its step and row" || fail "detect-anomaly input: $(cat "$tmp/a.err")"

# --fp32-ops: recorded in the checkpoint; another policy on resume needs --new-experiment.
expect_error "unknown fp32 op" 2 train --fp32-ops conv
"$belay" train --dtype fp16 --model mlp --steps 10 --stop-at 4 --checkpoint "$tmp/p.safetensors" --quiet
expect_error "resume under another op policy" 2 train --dtype fp16 --model mlp --steps 10 --resume "$tmp/p.safetensors" --fp32-ops gelu
"$belay" train --dtype fp16 --model mlp --steps 10 --resume "$tmp/p.safetensors" --fp32-ops gelu --new-experiment \
  --checkpoint "$tmp/p2.safetensors" >"$tmp/p.out" 2>&1 && grep -q 'fp32 ops gelu' "$tmp/p.out" &&
  grep -q '^experiment: new experiment at step 4' "$tmp/p.out" && pass "--new-experiment resumes under --fp32-ops gelu, recorded" ||
  fail "--new-experiment: $(cat "$tmp/p.out")"

# GPT tools (train, sample and validate with --model gpt): a tiny GPT (1 block, width 16,
# context 8) trained 20 steps on a tokens file made here (U8 ASCII text, vocabulary 128: a
# byte >= 128 is no token of it).
python3 - "$tmp/tok.safetensors" <<'PY'
import json, struct, sys
text = ("def f(x):\n    return x + 1\n" * 60).encode()
cut = len(text) * 9 // 10
parts = [("train", text[:cut]), ("heldout", text[cut:])]
header = {"__metadata__": {"tokens.format": "belay.tokens.v1", "tokens.vocab": "128"}}
at = 0
for name, b in parts:
    header[name] = {"dtype": "U8", "shape": [len(b)], "data_offsets": [at, at + len(b)]}
    at += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(b for _, b in parts))
PY
gpt=(--model gpt --data "$tmp/tok.safetensors" --layers 1 --width 16 --heads 2 --context 8 --batch 4)
"$belay" train "${gpt[@]}" --steps 20 --eval-every 10 --eval-windows 4 --csv "$tmp/gpt.csv" \
  --checkpoint "$tmp/gpt.ck" --quiet || fail "gpt: the tiny run"
# --attention: fused by default, naive the reference, recorded; another on resume is a new experiment.
expect_one_line_error "gpt: an unknown attention" 2 "--attention must be fused or naive, got 'flash'" \
  train "${gpt[@]}" --steps 2 --attention flash
"$belay" train "${gpt[@]}" --steps 20 --stop-at 10 --checkpoint "$tmp/att.ck" --quiet || fail "gpt: stop at 10"
expect_one_line_error "gpt: resume under another attention" 2 "attention=fused, this run has attention=naive" \
  train "${gpt[@]}" --steps 20 --resume "$tmp/att.ck" --attention naive
"$belay" train "${gpt[@]}" --steps 20 --resume "$tmp/att.ck" --attention naive --new-experiment \
  --checkpoint "$tmp/att2.ck" >"$tmp/att.out" 2>&1 &&
  grep -q "^experiment: new experiment at step 10 from .*: attention fused -> naive" "$tmp/att.out" &&
  pass "gpt: --attention naive on resume as a new experiment, said" || fail "gpt: attention new experiment: $(cat "$tmp/att.out")"
# belay sample: the prompt then the tokens; a seed repeats its text; temperature 0 needs none.
s1=$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 30 --temperature 0.8 --seed 1 | od -An -c)
s2=$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 30 --temperature 0.8 --seed 1 | od -An -c)
n=$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 30 --seed 1 | head -c 4)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$n" = "def " ] && pass "sample: the prompt continued, the same seed the same text" ||
  fail "sample: '$s1' vs '$s2', starts '$n'"
[ "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 31 --temperature 0 --seed 1 | wc -c)" -eq 36 ] &&
  pass "sample: --tokens 31 --temperature 0: 4 + 31 bytes and a newline" || fail "sample: byte count"
[ "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 20 --top-k 1 --seed 3 | od -An -c)" = \
  "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 20 --temperature 0 | od -An -c)" ] &&
  pass "sample: --top-k 1 is the argmax" || fail "sample: --top-k 1 differs from --temperature 0"
# The KV cache (the default) and --no-kv-cache give the same text, drawn, past the context of 8.
[ "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 40 --temperature 1.3 --seed 5 | od -An -c)" = \
  "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 40 --temperature 1.3 --seed 5 --no-kv-cache | od -An -c)" ] &&
  pass "sample: --no-kv-cache gives the cached path's text" || fail "sample: the KV cache changed the text"
# Streamed: head takes the first 20 bytes of a run that would take hours to end, and the
# pipeline ends because belay's next write after head exits meets a closed pipe. Text held
# until the end would never reach head: then the pipeline hangs and the timeout (a bound no
# streamed run comes near, not a measurement) fails it. The bytes are those of a short run.
first=$(timeout 600 bash -c '"$1" sample --checkpoint "$2" --prompt "def " --tokens 1000000000 --temperature 0.9 --seed 2 | head -c 20' \
  _ "$belay" "$tmp/gpt.ck" | od -An -c)
[ -n "$first" ] && [ "$first" = "$("$belay" sample --checkpoint "$tmp/gpt.ck" --prompt "def " --tokens 16 --temperature 0.9 --seed 2 | head -c 20 | od -An -c)" ] &&
  pass "sample: the text is streamed (head reads the first bytes of an endless run)" || fail "sample: not streamed: '$first'"
expect_one_line_error "sample: not a GPT checkpoint" 2 "is of a linear model, not a GPT" \
  sample --checkpoint "$tmp/c.safetensors" --prompt "def "
expect_one_line_error "sample: empty prompt" 2 "--prompt is empty" sample --checkpoint "$tmp/gpt.ck" --prompt ""
expect_one_line_error "sample: a byte the vocabulary lacks" 2 "prompt byte 1 (value 233) is not in the model's vocabulary of 128" \
  sample --checkpoint "$tmp/gpt.ck" --prompt $'d\xe9f'
expect_one_line_error "sample: negative temperature" 2 "--temperature must be a finite number >= 0" \
  sample --checkpoint "$tmp/gpt.ck" --prompt "def " --temperature -1
expect_one_line_error "sample: no tokens" 2 "--tokens must be at least 1" sample --checkpoint "$tmp/gpt.ck" --prompt "d" --tokens 0
expect_error "sample: a missing checkpoint" 2 sample --checkpoint "$tmp/none.ck" --prompt "d"
# belay validate on the GPT checkpoint: next-token decisions and the loss in FP32 and bf16.
"$belay" validate --checkpoint "$tmp/gpt.ck" --data "$tmp/tok.safetensors" --dtype bf16 --windows 4 \
  --json "$tmp/vg.json" >"$tmp/vg.out" 2>&1
rc=$?
{ [ $rc -eq 0 ] || [ $rc -eq 1 ]; } && grep -q '^decisions (next-token argmax, ties to the lowest id): [0-9]* changed of 32 ' "$tmp/vg.out" &&
  grep -q '^loss (nats per token): ' "$tmp/vg.out" &&
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["comparison"]["decisions"]["tokens"] == 32' "$tmp/vg.json" &&
  pass "validate: a GPT checkpoint's next-token decisions (exit $rc)" || fail "validate gpt: exit $rc, $(cat "$tmp/vg.out")"
expect_one_line_error "validate: a GPT without --data" 2 "give --data TOKENS.safetensors" validate --checkpoint "$tmp/gpt.ck"
# belay plot: the held-out loss drawn from the heldout_loss column.
"$belay" plot "$tmp/gpt.csv" -o "$tmp/gpt.svg" >/dev/null &&
  python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$tmp/gpt.svg" &&
  [ "$(grep -c '<circle' "$tmp/gpt.svg")" -eq 3 ] && grep -q '>held-out</text>' "$tmp/gpt.svg" &&
  pass "plot: a GPT log's held-out loss (2 points and the legend's)" || fail "plot: held-out loss"

# belay bpe: train a BPE on the tiny tokens file, its ids as a tokens file and Hugging Face's
# files; encode and decode through either; tokenize with the saved files gives the same ids;
# a GPT trained on the BPE ids samples text; export --format hf and import carry the tokenizer.
"$belay" bpe train --data "$tmp/tok.safetensors" --merges 12 -o "$tmp/bpe.st" --save-dir "$tmp/bpe" >"$tmp/bpe.out" 2>&1 &&
  grep -q "^bpe: 12 merges, vocabulary 268 (trained in " "$tmp/bpe.out" &&
  [ -f "$tmp/bpe/vocab.json" ] && [ -f "$tmp/bpe/merges.txt" ] && [ -f "$tmp/bpe/tokenizer.json" ] &&
  pass "bpe train: 12 merges, a tokens file and the three files" || fail "bpe train: $(cat "$tmp/bpe.out")"
ids=$("$belay" bpe encode --tokenizer "$tmp/bpe.st" --text "def f(x):")
[ -n "$ids" ] && [ "$ids" = "$("$belay" bpe encode --tokenizer "$tmp/bpe/tokenizer.json" --text "def f(x):")" ] &&
  [ "$("$belay" bpe decode --tokenizer "$tmp/bpe" $ids)" = "def f(x):" ] && [ "$(echo "$ids" | wc -w)" -lt 9 ] &&
  pass "bpe encode/decode: merged ids ($ids), the same from every source, decoded back" || fail "bpe encode/decode: '$ids'"
"$belay" bpe tokenize --tokenizer "$tmp/bpe" --data "$tmp/tok.safetensors" -o "$tmp/bpe2.st" >"$tmp/bpe2.out" 2>&1 &&
  [ "$(grep -o 'train [0-9]* bytes -> [0-9]* tokens' "$tmp/bpe.out")" = "$(grep -o 'train [0-9]* bytes -> [0-9]* tokens' "$tmp/bpe2.out")" ] &&
  pass "bpe tokenize: the saved files give the trained tokenizer's ids" || fail "bpe tokenize: $(cat "$tmp/bpe2.out")"
expect_one_line_error "bpe train on BPE ids" 2 "its ids are BPE tokens already" bpe train --data "$tmp/bpe.st" --merges 4 -o "$tmp/bpe3.st"
expect_one_line_error "bpe train over its own data" 2 "would overwrite --data" bpe train --data "$tmp/tok.safetensors" --merges 4 -o "$tmp/tok.safetensors"
expect_one_line_error "bpe train: more merges than pairs" 2 "no pair left to merge" bpe train --data "$tmp/tok.safetensors" --merges 5000 -o "$tmp/bpe3.st"
expect_one_line_error "bpe encode: text and file" 2 "one of them" bpe encode --tokenizer "$tmp/bpe.st" --text a --file "$tmp/bpe.out"
expect_one_line_error "bpe decode: not an id" 2 "'x1' is not a token id" bpe decode --tokenizer "$tmp/bpe.st" 5 x1
expect_one_line_error "bpe decode: an id out of range" 2 "token id 999 is out of range" bpe decode --tokenizer "$tmp/bpe.st" 999
expect_one_line_error "bpe: a byte tokens file has no tokenizer" 2 "its metadata has no tokens.bpe" bpe encode --tokenizer "$tmp/tok.safetensors" --text a
[ ! -e "$tmp/bpe3.st" ] && pass "bpe: a refused command wrote nothing" || fail "bpe: a refused command left a file"
bgpt=(--model gpt --data "$tmp/bpe.st" --layers 1 --width 16 --heads 2 --context 8 --batch 4)
"$belay" train "${bgpt[@]}" --steps 10 --checkpoint "$tmp/bgpt.ck" --quiet &&
  [ "$("$belay" sample --checkpoint "$tmp/bgpt.ck" --prompt "def f" --tokens 12 --seed 1 | head -c 5)" = "def f" ] &&
  pass "bpe: a GPT on BPE ids samples text from a prompt it encodes" || fail "bpe: GPT on BPE ids"
[ "$("$belay" sample --checkpoint "$tmp/bgpt.ck" --prompt $'d\xe9f' --tokens 6 --seed 1 | head -c 3 | od -An -tx1)" = " 64 e9 66" ] &&
  pass "bpe: a prompt of invalid UTF-8 is encoded byte by byte and written back as it was" || fail "bpe: invalid UTF-8 prompt"
"$belay" export "$tmp/bgpt.ck" -o "$tmp/hf" --format hf >/dev/null &&
  for f in config.json model.safetensors vocab.json merges.txt tokenizer.json; do [ -f "$tmp/hf/$f" ] || false; done &&
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); assert (c["n_positions"], c["vocab_size"], c["n_embd"]) == (8, 268, 16), c' "$tmp/hf/config.json" &&
  pass "export --format hf: config, weights and the tokenizer's files" || fail "export --format hf"
expect_one_line_error "export --format hf into a model's directory" 2 "already holds config.json" export "$tmp/bgpt.ck" -o "$tmp/hf" --format hf
"$belay" import "$tmp/hf" -o "$tmp/imported.st" >/dev/null &&
  [ "$("$belay" sample --checkpoint "$tmp/imported.st" --prompt "def f" --tokens 12 --seed 1)" = \
    "$("$belay" sample --checkpoint "$tmp/bgpt.ck" --prompt "def f" --tokens 12 --seed 1)" ] &&
  pass "import: the exported GPT samples the checkpoint's text" || fail "import of the export"
"$belay" validate --checkpoint "$tmp/imported.st" --data "$tmp/bpe.st" --dtype bf16 --windows 4 >"$tmp/vi.out" 2>&1
rc=$?
{ [ $rc -eq 0 ] || [ $rc -eq 1 ]; } && grep -q '^decisions (next-token argmax' "$tmp/vi.out" &&
  pass "validate: an imported model file (exit $rc)" || fail "validate of a model file: $(cat "$tmp/vi.out")"
expect_one_line_error "import: not a directory" 2 "is not a directory" import "$tmp/bgpt.ck" -o "$tmp/imported2.st"
# --init of the model file: the GPT's sizes come from it; a shorter context loads wpe's first rows.
"$belay" train --data "$tmp/bpe.st" --init "$tmp/imported.st" --steps 2 --batch 4 --quiet --print-config | grep -qx "width=16" &&
  "$belay" train --data "$tmp/bpe.st" --init "$tmp/imported.st" --context 4 --steps 2 --batch 4 --quiet &&
  pass "--init of a model file: its sizes, and a shorter --context" || fail "--init of a model file"
"$belay" train --data "$tmp/bpe.st" --init "$tmp/imported.st" --dtype fp16 --clip 1 --steps 4 --batch 4 \
  --checkpoint "$tmp/ft16.ck" --quiet && "$belay" sample --checkpoint "$tmp/ft16.ck" --prompt "def" --tokens 4 >/dev/null &&
  pass "--init of a model file: an fp16 fine-tune with loss scaling and clipping, sampled" || fail "fp16 fine-tune from a model file"
expect_one_line_error "--init: a width that differs" 2 "--width 32 differs from the init file's 16" \
  train --data "$tmp/bpe.st" --init "$tmp/imported.st" --width 32 --steps 2

echo "$fails failure(s)"
[ $fails -eq 0 ]
