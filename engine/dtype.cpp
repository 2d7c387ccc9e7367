#include "engine/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "engine/error.h"

namespace belay {

size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    default: return "fp32";
  }
}

DType parse_dtype(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") return DType::F32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw UsageError("unknown dtype '" + name + "': use fp32, fp16 or bf16");
}

FInfo finfo(DType dtype) {
  switch (dtype) {
    case DType::F16: return {16, 65504.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -10)};
    case DType::BF16:
      return {16, bf16_bits_to_f32(0x7f7f), std::ldexp(1.0f, -126), bf16_bits_to_f32(0x0001), std::ldexp(1.0f, -7)};
    default:
      return {32, f32_from_bits(0x7f7fffffu), std::ldexp(1.0f, -126), f32_from_bits(0x00000001u), std::ldexp(1.0f, -23)};
  }
}

}  // namespace belay
