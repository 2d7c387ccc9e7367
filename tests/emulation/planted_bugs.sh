#!/usr/bin/env bash
# Proof that the emulated GPU suite can fail: each argument names a planted bug, the GPU test
# binary built with it (tests/emulation/emulated_gpu_tests.cmake) and the test case that must
# catch it. Every bug must make that test fail: a wrong result, the shared-memory race check,
# a kernel fault the emulator reports, AddressSanitizer, or the memory metrics (a bank conflict).
#   usage: planted_bugs.sh "NAME|BINARY|TEST CASE" ...
set -u
total=0
caught=0
for spec in "$@"; do
  IFS='|' read -r name binary test_case <<<"$spec"
  total=$((total + 1))
  # A binary that is not there would "fail" too: that is a broken build, not a caught bug.
  if [ ! -x "$binary" ]; then
    echo "planted bug $name: NOT caught, its binary $binary was not built"
    continue
  fi
  # -a: stop at the first failed assertion; one seed is enough for a bug planted on purpose.
  out=$(BELAY_EMU_SEED=1 "$binary" -a "$test_case" 2>&1)
  rc=$?
  if grep -q "belay-planted: .* was not built" <<<"$out"; then
    echo "planted bug $name: NOT caught, $(grep -m1 -o 'belay-planted: .*' <<<"$out" | cut -c16-)"
    continue
  fi
  if grep -q "No test cases matched" <<<"$out"; then
    echo "planted bug $name: the test case '$test_case' does not exist"
    continue
  fi
  if [ $rc -eq 0 ]; then
    echo "planted bug $name: NOT caught, '$test_case' passed"
    continue
  fi
  if grep -q "belay-metrics: " <<<"$out"; then
    how="the memory metrics: $(grep -m1 -o 'belay-metrics: .*' <<<"$out" | cut -c16-300)"
  elif grep -q "belay-emu: .*shared-memory race" <<<"$out"; then
    how="the shared-memory race check: $(grep -m1 -o 'belay-emu: .*race.*' <<<"$out" | cut -c1-220)"
  elif grep -q "ERROR: AddressSanitizer" <<<"$out"; then
    how="AddressSanitizer: $(grep -m1 -o 'ERROR: AddressSanitizer: [a-z-]*' <<<"$out")"
  elif grep -q "belay-emu:" <<<"$out"; then
    how="an emulator fault: $(grep -m1 -o 'belay-emu: .*' <<<"$out" | cut -c1-220)"
  else
    how="a failed check: $(grep -m1 -E -A3 'FAILED' <<<"$out" | tr '\n' ' ' | tr -s ' ' | cut -c1-220)"
  fi
  echo "planted bug $name: caught by $how"
  caught=$((caught + 1))
done
echo "planted bugs: $caught of $total caught"
[ "$total" -gt 0 ] && [ "$caught" -eq "$total" ]
