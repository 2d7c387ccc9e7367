// Block conversions between FP32 and the 16-bit formats for the CPU kernels: the same bits
// as engine/half_bits.h (round to nearest even, subnormals kept, NaN stays NaN), but a
// block at a time so the loops vectorize. FP16 uses the F16C instructions when the CPU has
// them (checked once at run time); their results equal the integer conversions of
// half_bits.h bit for bit on every input (bench/README.md says how that was checked).
// Moves 6 bytes per element; no flops.
#pragma once
#include <cstdint>

// x86 builds get the F16C/AVX paths, chosen at run time; others the portable loops.
#if defined(__x86_64__) || defined(__i386__)
#define BELAY_X86 1
#else
#define BELAY_X86 0
#endif

namespace belay {

void cvt_f32_to_f16(const float* src, uint16_t* dst, int64_t n);
void cvt_f16_to_f32(const uint16_t* src, float* dst, int64_t n);
void cvt_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void cvt_bf16_to_f32(const uint16_t* src, float* dst, int64_t n);
bool cpu_has_f16c();  // whether the FP16 conversions take the F16C path

}  // namespace belay
