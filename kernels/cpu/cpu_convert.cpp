#include "kernels/cpu/cpu_convert.h"

#include <cstring>

#include "engine/half_bits.h"

#if BELAY_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace belay {
namespace {

#if BELAY_X86
// Eight at a time with F16C; the tail through the integer conversion. The rounding mode is
// given in the instruction (nearest even), so MXCSR's does not matter.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  const __m128i exp_quiet = _mm_set1_epi16(0x7e00), exp_only = _mm_set1_epi16(0x7c00);
  const __m128i mant = _mm_set1_epi16(0x03ff), zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    // F16C quiets a signalling NaN; half_bits.h keeps its payload as it is. Rare: redo those.
    const __m128i snan = _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(h, mant), zero),
                                          _mm_cmpeq_epi16(_mm_and_si128(h, exp_quiet), exp_only));
    if (_mm_movemask_epi8(snan))
      for (int64_t k = i; k < i + 8; ++k) dst[k] = f16_bits_to_f32(src[k]);
  }
  for (; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
}
#endif

bool detect_f16c() {
#if BELAY_X86
  // "avx" also checks that the OS saves the YMM state. F16C is read from CPUID leaf 1 (ECX
  // bit 29) directly: clang 14 does not know __builtin_cpu_supports("f16c").
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}



}  // namespace

// A function-local static: other translation units ask during their own static init.
bool cpu_has_f16c() {
  static const bool has = detect_f16c();
  return has;
}

void cvt_f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
#if BELAY_X86
  if (cpu_has_f16c()) return f32_to_f16_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
}

void cvt_f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
#if BELAY_X86
  if (cpu_has_f16c()) return f16_to_f32_f16c(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
}

// BF16 written branch-free (the same arithmetic as f32_to_bf16_bits) so it vectorizes.
void cvt_f32_to_bf16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    const uint32_t nan = (u >> 16) | 0x0040u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>(static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded);
  }
}

void cvt_bf16_to_f32(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

}  // namespace belay
