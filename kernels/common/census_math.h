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
};

// FP16: smallest subnormal 2^-24, smallest normal 2^-14 (10 mantissa bits).
// BF16: smallest subnormal 2^-133, smallest normal 2^-126 (7 mantissa bits).
BELAY_HD CensusBounds census_bounds(bool bf16) {
  return bf16 ? CensusBounds{f32_from_bits(0x00008000u), f32_from_bits(0x007f8000u)}   // 2^-134, 2^-126 - 2^-134
              : CensusBounds{f32_from_bits(0x33000000u), f32_from_bits(0x387fe000u)};  // 2^-25, 2^-14 - 2^-25
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

// The amax after x: finite magnitudes only.
BELAY_HD float census_amax(float amax, float x) {
  const float a = f32_from_bits(f32_bits(x) & 0x7fffffffu);
  return a <= 3.40282347e38f && a > amax ? a : amax;
}

}  // namespace belay
