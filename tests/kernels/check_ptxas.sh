#!/usr/bin/env bash
# Reads the ptxas report (-Xptxas -v) out of a build log and checks what the CUDA kernels
# promise of their compiled form:
#   - every kernel was compiled for every architecture in ARCHS (default: sm_80 sm_90);
#   - no GEMM kernel, no optimizer kernel (AdamW, SGD) and no attention kernel uses local memory
#     for spills or a stack frame. They are picked by their mangled names, which hold the source file's name
#     too, so every kernel of gemm_*.cu and of optimizer_kernels.cu is held to this. Spills
#     elsewhere are listed, not fatal.
# The table, one line per kernel and architecture (registers, stack, spills), goes to REPORT
# when given, else to stdout; then a summary line. Exit 0: checks pass; 1: a check failed; 2: usage, or the log
# holds no ptxas report at all (an incremental build that recompiled no CUDA file).
#   usage: check_ptxas.sh BUILD_LOG [REPORT]        ARCHS="sm_80 sm_90" by default
set -euo pipefail
log=${1:?usage: check_ptxas.sh BUILD_LOG [REPORT]}
report=${2:-}
archs=${ARCHS:-sm_80 sm_90}
[ -r "$log" ] || { echo "check_ptxas: cannot read $log" >&2; exit 2; }

# One record per (kernel, arch): ptxas prints "Compiling entry function 'NAME' for 'ARCH'",
# then "N bytes stack frame, S bytes spill stores, L bytes spill loads" and "Used R registers".
# Device functions that are not kernels ("Function properties for" without an entry line)
# belong to the kernel compiled just before; their numbers are not the kernel's and are
# skipped.
table=$(awk '
  /Compiling entry function/ {
    if (name != "") print name, arch, regs, stack, st, ld
    match($0, /entry function \047[^\047]+\047/); name = substr($0, RSTART + 16, RLENGTH - 17)
    match($0, /for \047[^\047]+\047/); arch = substr($0, RSTART + 5, RLENGTH - 6)
    regs = "?"; stack = "?"; st = "?"; ld = "?"; props = 0; next
  }
  /Function properties for/ { props = (name != "" && index($0, name) > 0); next }
  /bytes stack frame/ && props { stack = $1; st = $5; ld = $9; next }
  /Used [0-9]+ registers/ && name != "" && regs == "?" {
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
  }
  END { if (name != "") print name, arch, regs, stack, st, ld }
' "$log")

if [ -z "$table" ]; then
  echo "check_ptxas: no ptxas report in $log (was any CUDA file compiled in this build?)" >&2
  exit 2
fi

status=0
pretty=$(while read -r name arch regs stack st ld; do
  printf '%-6s %4s regs %5s B stack %5s/%-5s B spill st/ld  %s\n' "$arch" "$regs" "$stack" "$st" "$ld" \
    "$(c++filt "$name" 2>/dev/null || echo "$name")"
done <<<"$table")
if [ -n "$report" ]; then echo "$pretty" >"$report"; else echo "$pretty"; fi

# Every kernel for every architecture.
for arch in $archs; do
  missing=$(comm -23 <(awk '{print $1}' <<<"$table" | sort -u) \
                     <(awk -v a="$arch" '$2 == a {print $1}' <<<"$table" | sort -u))
  if [ -n "$missing" ]; then
    echo "check_ptxas: not compiled for $arch: $(c++filt <<<"$missing" | tr '\n' ' ')" >&2
    status=1
  fi
done

# No spills and no stack in the GEMM and optimizer kernels; others only reported.
while read -r name arch regs stack st ld; do
  case "$name" in
    *gemm*|*adamw*|*sgd*|*optimizer_kernels*|*attention_*) strict=1 ;;
    *) strict=0 ;;
  esac
  if [ "$st" != 0 ] || [ "$ld" != 0 ] || { [ $strict = 1 ] && [ "$stack" != 0 ]; }; then
    what="$(c++filt "$name" 2>/dev/null || echo "$name") ($arch): $stack B stack, $st/$ld B spill stores/loads"
    if [ $strict = 1 ]; then
      echo "check_ptxas: FAIL: $what" >&2
      status=1
    else
      echo "check_ptxas: note: $what" >&2
    fi
  fi
done <<<"$table"

kernels=$(awk '{print $1}' <<<"$table" | sort -u | wc -l)
echo "check_ptxas: $kernels kernels x {$archs}: $([ $status = 0 ] && echo pass || echo FAIL)"
exit $status
