// The three floating-point types belay computes in, their limits (finfo) and the
// host-side helpers to round a float through each of them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/half_bits.h"

namespace belay {

enum class DType : uint8_t { F32, F16, BF16 };

struct FInfo {
  int bits;
  float max;
  float smallest_normal;
  float smallest_subnormal;
  float eps;  // distance from 1.0 to the next representable value
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);    // "fp32", "fp16", "bf16"
DType parse_dtype(const std::string& name);  // accepts fp32/f32/float32 and the like; throws UsageError
FInfo finfo(DType dtype);

// The value `x` becomes when stored in `dtype` (round to nearest even).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::F16: return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::BF16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    default: return x;
  }
}

// Element load/store on raw storage of any dtype, converting through FP32.
inline float load_as_f32(const void* base, DType dtype, size_t i) {
  switch (dtype) {
    case DType::F16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

inline void store_from_f32(void* base, DType dtype, size_t i, float x) {
  switch (dtype) {
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(x); break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(x); break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

}  // namespace belay
