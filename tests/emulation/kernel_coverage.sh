#!/usr/bin/env bash
# Which __global__ kernels of kernels/cuda/ ran under the emulator, from the launch counts the
# emulated test runs appended to the log (BELAY_EMU_COVERAGE). Prints a table (also written
# to REPORT) and the line "emulated kernels: N of M ran"; fails unless every kernel ran.
#   usage: kernel_coverage.sh REPO_ROOT LOG REPORT
set -euo pipefail
root=$1 log=$2 report=$3
[ -s "$log" ] || { echo "emulated kernels: no launch log at $log (did the emulated suite run?)"; exit 1; }
kernels=$(grep -ho '__global__ void \(__launch_bounds__([^)]*) \)\?[A-Za-z_0-9]*' "$root"/kernels/cuda/*.cu |
          sed -E 's/.* ([A-Za-z_0-9]+)$/\1/' | sort -u)
total=0 ran=0
{
  printf '%-32s %12s\n' kernel launches
  for k in $kernels; do
    total=$((total + 1))
    # Launches of every instance of the kernel (gcc names template instances apart, clang not).
    count=$(awk -F'\t' -v k="$k" '{ n = $1; sub(/<.*/, "", n); if (n == k) s += $2 } END { print s + 0 }' "$log")
    [ "$count" -gt 0 ] && ran=$((ran + 1))
    printf '%-32s %12s\n' "$k" "$count"
  done
} >"$report"
cat "$report"
echo "emulated kernels: $ran of $total ran"
[ "$ran" -eq "$total" ]
