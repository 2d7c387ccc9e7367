#!/usr/bin/env bash
# The one-definition rule across the per-ISA copies of the CPU kernels (kernels/cpu/isa/),
# checked on their object files:
#   1. every global or weak symbol an ISA's object defines carries that ISA's name
#      (isa_<isa> for belay's code, Eigen_<isa> for Eigen's renamed namespace), so the
#      linker can never merge one copy's template with another's. Exceptions, each harmless
#      whichever copy the linker keeps: data the compilers emit alike in every copy
#      (typeinfo, DW.ref.__gxx_personality_v0, an OpenMP reduction's lock word
#      .gomp_critical_user_*), and a function outside the namespaces that holds no VEX/EVEX
#      instruction at all (clang's __clang_call_terminate; std::bad_alloc's constructor in
#      an unoptimised sanitizer build), listed as a note;
#   2. the instructions are the ISA's: baseline has no VEX/EVEX instruction at all, avx2
#      has FMAs on ymm and no zmm or opmask register, avx512 has FMAs on zmm, avx512bf16
#      has VDPBF16PS on zmm (its GEMM's and the attention's BF16 pairs; the bench's peak loop), amx has
#      TDPBF16PS (its GEMM's tiles; the bench's tile loop), amx_emulated (the same GEMM on
#      the tile emulator, for any x86-64 CPU) has no VEX/EVEX and no tile instruction; the element
#      kernels (element_blocks*) and the classifier's rows (classifier_rows*) have no FMA at
#      all on any path (their bits must be the baseline's) and use ymm registers on avx2/avx512.
#   usage: check_isa_objects.sh ISA=OBJ[:OBJ...] ...
#          (ISA: baseline, avx2, avx512, avx512bf16, amx, amx_emulated)
set -u
fail=0
say() { echo "check_isa_objects: $*"; }
for arg in "$@"; do
  isa=${arg%%=*}
  IFS=':' read -r -a objs <<<"${arg#*=}"
  for obj in "${objs[@]}"; do
    [ -f "$obj" ] || { say "$isa: no object file $obj"; fail=1; continue; }
    name="$isa:$(basename "$obj")"
    # 1. symbols: defined and visible outside the object (upper-case types, u, V, W)
    outside=$(nm --defined-only "$obj" | awk '$2 ~ /^[A-TV-Zuvw]$/ {print $2, $3}' |
              grep -v -e "Eigen_${isa}" -e "isa_${isa}" || true)
    n_syms=$(nm --defined-only "$obj" | awk '$2 ~ /^[A-TV-Zuvw]$/' | wc -l)
    n_leaked=0 n_neutral=0
    while read -r type sym; do
      [ -n "$sym" ] || continue
      case $sym in _ZTI* | _ZTS* | DW.ref.__gxx_personality_v0 | .gomp_critical_user_*) continue ;; esac
      if [[ $type =~ ^[TWwi]$ ]] &&
         ! objdump -d --no-show-raw-insn --disassemble="$sym" "$obj" | grep -qE '^\s+[0-9a-f]+:\s+v[a-z0-9]+\s'; then
        n_neutral=$((n_neutral + 1))
        say "$name: note: $(c++filt <<<"$sym" | cut -c1-120) is shared across copies, but holds no VEX/EVEX instruction"
        continue
      fi
      n_leaked=$((n_leaked + 1))
      say "$name defines $(c++filt <<<"$sym" | cut -c1-140) ($type) outside its namespaces: the linker could share it across ISAs"
      fail=1
    done <<<"$outside"
    # 2. instructions
    asm=$(objdump -d --no-show-raw-insn "$obj")
    fma_ymm=$(grep -cE 'vfn?m(add|sub)[0-9]+ps.*%ymm' <<<"$asm")
    fma_zmm=$(grep -cE 'vfn?m(add|sub)[0-9]+ps.*%zmm' <<<"$asm")
    dot_zmm=$(grep -cE 'vdpbf16ps.*%zmm' <<<"$asm")
    tile_dot=$(grep -cE 'tdpbf16ps' <<<"$asm")
    tile_any=$(grep -cE '(tdp[a-z0-9]+|tile[a-z]+|ldtilecfg)\s' <<<"$asm")
    vex=$(grep -cE '^\s+[0-9a-f]+:\s+v[a-z0-9]+\s' <<<"$asm")
    zmm=$(grep -cE '%zmm|%k[0-7]' <<<"$asm")
    ymm=$(grep -cE '%ymm' <<<"$asm")
    if [[ $(basename "$obj") == element_blocks* || $(basename "$obj") == classifier_rows* ]]; then
      # The element kernels and the classifier's rows must give the baseline's bits: no fused
      # multiply-add in FP32 or scalar (-ffp-contract=off), and the wider paths must actually
      # be wider. Packed FP64 ones are the guard's sums of squares, written as intrinsics: each
      # square of an FP32 value is exact in FP64, so the FMA rounds once as multiply-then-add.
      fma_any=$(grep -cE 'vfn?m(add|sub)[0-9]+(ps|ss|sd)' <<<"$asm")
      fma_pd=$(grep -cE 'vfn?m(add|sub)[0-9]+pd' <<<"$asm")
      [[ $(basename "$obj") == element_blocks* ]] || { fma_any=$((fma_any + fma_pd)); fma_pd=0; }  # only the guard's
      [ "$fma_any" -eq 0 ] || { say "$name: $fma_any FP32 or scalar fused multiply-adds in the element kernels"; fail=1; }
      case $isa in
        baseline) [ "$vex" -eq 0 ] || { say "$name: $vex VEX/EVEX instructions in the baseline path"; fail=1; } ;;
        avx2 | avx512) [ "$ymm" -gt 0 ] || { say "$name: no instruction on ymm registers"; fail=1; } ;;
      esac
      [ "$isa" != avx2 ] || [ "$zmm" -eq 0 ] || { say "$name: $zmm instructions use zmm/opmask registers"; fail=1; }
      say "$name: $n_syms global/weak symbols ($n_leaked outside its namespaces, $n_neutral ISA-neutral shared); VEX/EVEX instructions $vex, on ymm $ymm, FMA $fma_any (FP64 sums of squares $fma_pd)"
      continue
    fi
    case $isa in
      baseline) [ "$vex" -eq 0 ] || { say "$name: $vex VEX/EVEX instructions in the baseline path"; fail=1; } ;;
      avx2) [ "$fma_ymm" -gt 0 ] || { say "$name: no FMA on ymm registers"; fail=1; }
            [ "$zmm" -eq 0 ] || { say "$name: $zmm instructions use zmm/opmask registers"; fail=1; } ;;
      avx512) [ "$fma_zmm" -gt 0 ] || { say "$name: no FMA on zmm registers"; fail=1; } ;;
      avx512bf16) [ "$dot_zmm" -gt 0 ] || { say "$name: no VDPBF16PS on zmm registers"; fail=1; } ;;
      amx) [ "$tile_dot" -gt 0 ] || { say "$name: no TDPBF16PS"; fail=1; } ;;
      amx_emulated) [ "$vex" -eq 0 ] || { say "$name: $vex VEX/EVEX instructions in the emulated copy"; fail=1; }
                    [ "$tile_any" -eq 0 ] || { say "$name: $tile_any tile instructions in the emulated copy"; fail=1; } ;;
      *) say "unknown ISA '$isa'"; fail=1 ;;
    esac
    say "$name: $n_syms global/weak symbols ($n_leaked outside its namespaces, $n_neutral ISA-neutral shared); VEX/EVEX instructions $vex, FMA on ymm $fma_ymm, on zmm $fma_zmm, VDPBF16PS $dot_zmm, TDPBF16PS $tile_dot, tile instructions $tile_any"
  done
done
[ $# -gt 0 ] || { say "usage: check_isa_objects.sh ISA=OBJ ..."; exit 2; }
exit $fail
