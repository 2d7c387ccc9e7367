#!/usr/bin/env bash
# The CLI as a user meets it: exit codes, one-line errors, files written or not.
# Usage: cli_test.sh path/to/belay
set -u
belay=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# expect_error NAME EXIT_CODE ARGS...: stderr is exactly one line starting "belay: error: ".
expect_error() {
  local name=$1 code=$2
  shift 2
  "$belay" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq "$code" ] && [ "$lines" -eq 1 ] && grep -q '^belay: error: ' "$tmp/err"; then
    pass "$name (exit $rc: $(cat "$tmp/err"))"
  else
    fail "$name: exit $rc (want $code), stderr: $(cat "$tmp/err")"
  fi
}

expect_error "zero steps" 2 train --steps 0
expect_error "negative steps" 2 train --steps -3
expect_error "more steps than the device count holds" 2 train --steps 16777217
expect_error "zero batch" 2 train --batch 0
expect_error "negative in" 2 train --in -1
expect_error "zero out" 2 train --out 0
expect_error "non-numeric steps" 2 train --steps many
expect_error "unknown dtype" 2 train --dtype fp8
expect_error "unknown model" 2 train --model transformer
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
"$belay" train --steps 30 --resume "$tmp/c.safetensors" --csv "$tmp/c.csv" --quiet
[ "$(($(wc -l <"$tmp/c.csv") - 1))" -eq 30 ] && pass "resumed csv has 30 rows" || fail "resumed csv rows"
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
if "$belay" train --model mlp --in 256 --hidden 512 --steps 100000 --stop-at 40 --resume "$tmp/k.safetensors" \
  --csv "$tmp/k.csv" --quiet && [ "$(tail -1 "$tmp/k.csv" | cut -d, -f1)" = 39 ] &&
  awk -F, 'NR>1 && $1!=NR-2 {bad=1} END {exit bad}' "$tmp/k.csv"; then
  pass "kill -9: the last checkpoint resumes, the log reads as one run"
else
  fail "kill -9: resume from the last checkpoint"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
