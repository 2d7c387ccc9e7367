// The CPU backend's cast and fill (kernels/cpu/cpu_kernels.h). cast moves (src + dst) bytes
// per element; fill writes each element once.
#include "engine/census.h"
#include "kernels/common/census_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"  // CensusCounts

namespace belay::cpu {

void cast(const Tensor& src, Tensor& dst) {
  if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;
  if (src.dtype() == dst.dtype()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  // A block at a time: widened into FP32 where src is not FP32 (a pointer into it where it
  // is), then rounded once into dst's dtype (straight into dst where it is FP32): the
  // conversions of map_blocks, without its copy from the input block to the output block.
  const void* from = src.data();
  void* to = dst.data();
  const DType from_dtype = src.dtype(), to_dtype = dst.dtype();
  parallel_blocks(src.numel(), [&](int64_t i0, int64_t len) {
    alignas(64) float buf[kBlock];
    float* widened = to_dtype == DType::F32 ? static_cast<float*>(to) + i0 : buf;
    store_block(to, to_dtype, i0, len, load_block(from, from_dtype, i0, len, widened));
  });
}

// FP32 src times the scalar, a block at a time in L1, rounded once into dst (in place where
// dst is FP32): scale_inplace's product, then cast's rounding.
void scale_cast(const Tensor& src, const Tensor& factor, Tensor& dst) {
  const float f = factor.data_as<const float>()[0];
  const float* from = src.data_as<const float>();
  void* to = dst.data();
  const DType to_dtype = dst.dtype();
  parallel_blocks(src.numel(), [&](int64_t i0, int64_t len) {
    alignas(64) float buf[kBlock];
    float* scaled = to_dtype == DType::F32 ? static_cast<float*>(to) + i0 : buf;
    for (int64_t j = 0; j < len; ++j) scaled[j] = from[i0 + j] * f;
    store_block(to, to_dtype, i0, len, scaled);
  });
}

// The cast's blocks (map_blocks: the same conversion, so the same bits as cast), each block's
// census taken from its FP32 values while they sit in L1: memory is read once. Each block
// counts into its own slot; the slots are merged after (integer sums and a max: any order
// gives the same record).
void cast_census(const Tensor& src, Tensor& dst, Tensor& record) {
  const CensusBounds bounds = census_bounds(dst.dtype() == DType::BF16);
  std::vector<CensusCounts> per_block(static_cast<size_t>((src.numel() + kBlock - 1) / kBlock));
  map_blocks(
      dst,
      [&](int64_t i0, int64_t len, float* r, const float* v) {
        CensusCounts& c = per_block[static_cast<size_t>(i0 / kBlock)];
        for (int64_t j = 0; j < len; ++j) c.add(cast_census_class(v[j], bounds), v[j]);
        std::memcpy(r, v, len * 4);
      },
      src);
  CensusCounts sum;
  for (const CensusCounts& c : per_block) sum.merge(c);
  uint32_t* w = record.data_as<uint32_t>();  // the counts add up: each < 2^32 (backend_checks)
  w[kCensusNonfinite] += static_cast<uint32_t>(sum.nonfinite);
  w[kCensusZeros] += static_cast<uint32_t>(sum.zeros);
  w[kCensusUnderflow] += static_cast<uint32_t>(sum.underflow);
  w[kCensusSubnormal] += static_cast<uint32_t>(sum.subnormal);
  float amax = 0.0f;
  std::memcpy(&amax, &w[kCensusAmax], sizeof amax);
  amax = std::max(amax, sum.amax);
  std::memcpy(&w[kCensusAmax], &amax, sizeof amax);
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
