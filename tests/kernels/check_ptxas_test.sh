#!/usr/bin/env bash
# check_ptxas.sh on small made-up logs: it passes a clean report and fails the ones it must.
set -uo pipefail
check="$(dirname "${BASH_SOURCE[0]}")/check_ptxas.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# entry NAME ARCH REGS STACK SPILL_STORES SPILL_LOADS
entry() {
  echo "ptxas info    : Compiling entry function '$1' for '$2'"
  echo "ptxas info    : Function properties for $1"
  echo "    $4 bytes stack frame, $5 bytes spill stores, $6 bytes spill loads"
  echo "ptxas info    : Used $3 registers, used 1 barriers, 416 bytes cmem[0]"
  echo "ptxas info    : Compile time = 1.0 ms"
}
# A device function called by the kernel before it: its numbers are not the kernel's.
callee() {
  echo "ptxas info    : Function properties for _Z7store_cPv"
  echo "    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads"
}

expect() {  # expect RC NAME: run the check on $dir/NAME.log
  "$check" "$dir/$2.log" >"$dir/$2.out" 2>&1
  local rc=$?
  if [ "$rc" != "$1" ]; then
    echo "FAIL: $2: exit $rc, expected $1"; cat "$dir/$2.out"; failures=$((failures + 1))
  else
    echo "ok: $2 (exit $rc)"
  fi
}

{ for a in sm_80 sm_90; do
    entry _Z14gemm_tc_kernelv $a 154 0 0 0; callee; entry _Z11adamw_kernelv $a 58 0 0 0
    entry _Z11cast_kernelv $a 23 0 0 0
  done; } >"$dir/clean.log"
expect 0 clean
grep -q "154 regs" "$dir/clean.out" || { echo "FAIL: clean: the table lacks the registers"; failures=$((failures + 1)); }

{ for a in sm_80 sm_90; do entry _Z14gemm_tc_kernelv $a 128 0 0 0; done
  entry _Z11adamw_kernelv sm_80 58 0 0 0; } >"$dir/missing_arch.log"
expect 1 missing_arch

{ for a in sm_80 sm_90; do entry _Z14gemm_tc_kernelv $a 128 0 0 0; done
  entry _Z11adamw_kernelv sm_80 58 0 0 0; entry _Z11adamw_kernelv sm_90 64 16 16 16; } >"$dir/adamw_spills.log"
expect 1 adamw_spills

{ for a in sm_80 sm_90; do entry _Z14gemm_tc_kernelv $a 255 8 0 0; done; } >"$dir/gemm_stack.log"
expect 1 gemm_stack

{ for a in sm_80 sm_90; do entry _Z14gemm_tc_kernelv $a 128 0 0 0; entry _Z11cast_kernelv $a 40 32 4 4; done; } \
  >"$dir/other_spills.log"
expect 0 other_spills
grep -q "note: .*cast_kernel" "$dir/other_spills.out" || { echo "FAIL: other_spills: no note"; failures=$((failures + 1)); }

echo "[100%] Built target belay_core" >"$dir/no_report.log"
expect 2 no_report

[ $failures = 0 ] && echo "all cases pass" || { echo "$failures case(s) failed"; exit 1; }
