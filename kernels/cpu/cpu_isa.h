// Which x86 vector ISA the CPU kernels run: detected once (cpuid for what the CPU has,
// xgetbv for what the OS saves on a context switch), at first use, and overridable by
// BELAY_CPU_ISA=baseline|avx2|avx512|avx512bf16|amx or `belay --cpu-isa` (engine/backend.h's
// select_cpu_isa). Every path is compiled into every binary (kernels/cpu/isa/), so one
// binary runs the widest path the machine in hand allows; no -march=native anywhere.
// amx included since it ran on AMX hardware (an Intel Xeon, 2026-12-04: the whole suite on it,
// and its BF16 products 3.6-4.3x the avx512 FP32 GEMM's speed, docs/cpu-kernels.md); CI without
// AMX still runs its code under an emulator of the tile instructions.
#pragma once
#include <string>
#include <vector>

namespace belay {

// Ordered: a path needs everything the paths before it need. Avx512Bf16 is Avx512 whose
// BF16 x BF16 products run VDPBF16PS (kernels/cpu/isa/gemm_packed.cpp; the BF16 attention's:
// kernels/cpu/isa/attention_vdpbf16.cpp); everything else on it is the Avx512 code. Amx is
// Avx512Bf16 whose BF16 x BF16 products run on AMX tiles (TDPBF16PS, kernels/cpu/isa/gemm_amx.cpp,
// kernels/cpu/isa/attention_amx.cpp).
enum class CpuIsa { Baseline = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16,
                                         CpuIsa::Amx};

// What cpuid and xgetbv report. The os_* flags: the OS saves that register state (XCR0).
struct CpuFeatures {
  bool sse2 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, amx_tile = false, amx_bf16 = false;
  bool os_ymm = false, os_zmm = false, os_amx = false;
  bool amx_permitted = false;  // Linux granted the tile data (arch_prctl ARCH_REQ_XCOMP_PERM)
};
const CpuFeatures& cpu_features();  // detected once

const char* cpu_isa_name(CpuIsa isa);               // "baseline", "avx2", "avx512", "avx512bf16", "amx"
CpuIsa parse_cpu_isa(const std::string& name);      // UsageError naming the choices
std::vector<std::string> cpu_isa_missing(CpuIsa isa);  // features this CPU/OS lacks for it; empty: runnable
bool cpu_isa_available(CpuIsa isa);
CpuIsa best_cpu_isa();                              // the widest available path

// The path the kernels use: decided once, at first use, from BELAY_CPU_ISA or else the
// widest available; throws UsageError if the variable names an unknown or unavailable path.
CpuIsa active_cpu_isa();
// Sets the path from now on (the CLI option; tests); UsageError if the CPU lacks it.
void force_cpu_isa(CpuIsa isa);

std::string cpu_features_string();  // "sse2 avx avx2 fma f16c" ...: what the CPU (and OS) has
std::string cpu_isa_report();       // "avx2 (cpu has: sse2 avx avx2 fma f16c)"

}  // namespace belay
