// The CPU backend's cast and fill (kernels/cpu/cpu_kernels.h). cast moves (src + dst) bytes
// per element; fill writes each element once.
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace belay::cpu {

void cast(const Tensor& src, Tensor& dst) {
  if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;
  if (src.dtype() == dst.dtype()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  map_blocks(dst, [](int64_t, int64_t len, float* r, const float* v) { std::memcpy(r, v, len * 4); }, src);
}

void fill(Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::F32) {
    float* p = t.data_as<float>();
    parallel_blocks(n, [&](int64_t i0, int64_t len) { std::fill(p + i0, p + i0 + len, value); });
    return;
  }
  const uint16_t bits = t.dtype() == DType::F16 ? f32_to_f16_bits(value) : f32_to_bf16_bits(value);
  uint16_t* p = t.data_as<uint16_t>();
  parallel_blocks(n, [&](int64_t i0, int64_t len) { std::fill(p + i0, p + i0 + len, bits); });
}

}  // namespace belay::cpu
