// The census's classification of one stored gradient value, written once for the CPU paths
// and the CUDA guard (BELAY_HD). The bounds follow from round-to-nearest-even into the
// format: a value at or below half the smallest subnormal rounds to zero (the tie goes to
// the even zero); one below the midpoint between the largest subnormal and the smallest
// normal lands subnormal (that tie goes to the normal, whose mantissa is even). Both bounds
// are exact FP32 numbers, so the classes are exact comparisons on the FP32 value.
#pragma once
#include <cstdint>

#include "engine/census.h"
#include "engine/half_bits.h"

namespace belay {

struct CensusBounds {
  float to_zero;          // |x| <= to_zero: rounds to 0 in the format
  float subnormal_below;  // to_zero < |x| < subnormal_below: a subnormal of the format
  float overflow_at;      // |x| >= overflow_at (finite): rounds to inf in the format
};

// FP16: smallest subnormal 2^-24, smallest normal 2^-14 (10 mantissa bits), largest finite
// 65504 (the midpoint 65520 to the next power, 2^16, ties to it: its mantissa is even).
// BF16: smallest subnormal 2^-133, smallest normal 2^-126 (7 mantissa bits), largest finite
// 0x7f7f (the midpoint 0x7f7f8000 as FP32 ties to 0x7f80, inf).
BELAY_HD CensusBounds census_bounds(bool bf16) {
  return bf16 ? CensusBounds{f32_from_bits(0x00008000u), f32_from_bits(0x007f8000u),   // 2^-134, 2^-126 - 2^-134
                             f32_from_bits(0x7f7f8000u)}                               // (2 - 2^-8) 2^127
              : CensusBounds{f32_from_bits(0x33000000u), f32_from_bits(0x387fe000u),   // 2^-25, 2^-14 - 2^-25
                             f32_from_bits(0x477ff000u)};                              // 65520
}

// The class of x: one of kCensusNonfinite, kCensusZeros, kCensusUnderflow, kCensusSubnormal,
// or kCensusFields for a normal value (counted nowhere; it only takes part in the amax).
BELAY_HD int census_class(float x, CensusBounds b) {
  const float a = f32_from_bits(f32_bits(x) & 0x7fffffffu);
  if (!(a <= 3.40282347e38f)) return kCensusNonfinite;  // inf, and NaN (every comparison false)
  if (a == 0.0f) return kCensusZeros;
  if (a <= b.to_zero) return kCensusUnderflow;
  if (a < b.subnormal_below) return kCensusSubnormal;
  return kCensusFields;
}

// The class of an FP32 value cast into the format (Backend::cast_census): census_class, but a
// finite value that rounds to inf counts as non-finite too (what the cast made of it).
BELAY_HD int cast_census_class(float x, CensusBounds b) {
  const int c = census_class(x, b);
  return c == kCensusFields && f32_from_bits(f32_bits(x) & 0x7fffffffu) >= b.overflow_at ? kCensusNonfinite : c;
}

// The amax after x: finite magnitudes only.
BELAY_HD float census_amax(float amax, float x) {
  const float a = f32_from_bits(f32_bits(x) & 0x7fffffffu);
  return a <= 3.40282347e38f && a > amax ? a : amax;
}

}  // namespace belay
