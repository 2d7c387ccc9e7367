// Bit-exact conversions between FP32 and the two 16-bit formats, written once for the
// host and the device (BELAY_HD). Round to nearest even, subnormals kept, +-inf and NaN
// preserved, FP16 overflow to inf. Integer arithmetic only, so every compiler and every
// backend gives the same bits.
//
// On a real GPU (__CUDA_ARCH__) every value but NaN goes through the hardware's cvt instead:
// PTX's cvt.rn is IEEE 754's round to nearest even with subnormals kept, the same bits as the
// integer code (which tests/engine/test_dtype.cpp checks against an independent rounding, and
// the CPU's F16C path against, in the same way), in one instruction where the integer FP16
// code branches: the attention's probabilities, mostly small, took its subnormal branch, and
// the fp16 attention kernel held twice the bf16 one's PTX and eight times its branches. NaN
// keeps the integer path and its payload rule (the CPU's F16C path does the same). The
// emulated device (host C++, no __CUDA_ARCH__) runs the integer code.
#pragma once
#include <cstdint>
#include <cstring>

// A file may define BELAY_HD itself first: the per-ISA CPU kernels (kernels/cpu/isa/) make
// these functions `static inline`, so no copy built with wider -m flags is shared by name.
// On the host they are always inlined, as __forceinline__ does on the device: an out-of-line
// call reaches whichever copy the linker kept, and in the sanitizer build (apps/ at -O0) that
// was an -O0 one, called from every place the compiler may not inline (the emulator's
// tensor-core twins, outside ASan's reach, cannot inline an instrumented function):
// f32_from_bits through __asan_memcpy was 45% of `belay train --device cuda` there.
#if defined(BELAY_HD)
#elif defined(__CUDACC__)
#define BELAY_HD __host__ __device__ __forceinline__
#else
#define BELAY_HD inline __attribute__((always_inline))
#endif

namespace belay {

BELAY_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

BELAY_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// FP32 -> BF16: keep the top 16 bits, rounding the dropped 16 to nearest even.
// NaN is forced to a quiet NaN so rounding can never carry it into inf.
BELAY_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short hw;  // computed for NaN too, then not taken: a select, not a branch
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hw) : "f"(f));
  return (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x0040u) : hw;
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

// The same bits as f32_to_bf16_bits, written as a select with no branch, so that a CPU loop
// of it vectorizes (the CPU cast kernels, the attention's P and dS on BF16 pairs).
BELAY_HD uint16_t f32_to_bf16_bits_select(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t nan = (u >> 16) | 0x0040u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // a signed compare (u & 0x7fffffff fits): SSE2 and AVX2 have no unsigned one
  return static_cast<uint16_t>(static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded);
}

BELAY_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// FP32 -> FP16 (1 sign, 5 exponent, 10 mantissa bits, bias 15).
BELAY_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  const uint16_t nan = static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
#if defined(__CUDA_ARCH__)
  unsigned short hw;  // computed for NaN too, then not taken: a select, not a branch
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hw) : "f"(f));
  return abs > 0x7f800000u ? nan : hw;
#endif
  if (abs > 0x7f800000u) return nan;
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {                                            // normal FP16 (>= 2^-14)
    uint32_t lsb = (abs >> 13) & 1u;
    uint32_t rounded = abs + 0xfffu + lsb;  // round the 13 dropped bits to nearest even
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal FP16: value = mant * 2^-24. Shift the full 24-bit significand into place.
  uint32_t exp = abs >> 23;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp;  // exp in [102, 112] -> shift in [14, 24]
  uint32_t half_mant = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant += 1u;
  return static_cast<uint16_t>(sign | half_mant);  // may carry into the smallest normal: correct
}

BELAY_HD float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  const float inf_or_nan = f32_from_bits(sign | 0x7f800000u | (mant << 13));
#if defined(__CUDA_ARCH__)
  float hw;  // exact for every finite value; inf and NaN keep the integer rule (a select)
  asm("cvt.f32.f16 %0, %1;" : "=f"(hw) : "h"(h));
  return exp == 0x1fu ? inf_or_nan : hw;
#endif
  if (exp == 0x1fu) return inf_or_nan;
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);
  // Subnormal: normalise the mantissa into an FP32 normal.
  uint32_t e = 113u;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

}  // namespace belay
