// The CPU backend's belts (kernels/cpu/cpu_kernels.h): the fused guard (found_inf and the
// global norm in one read of every gradient), the clip coefficient, the unfused unscale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/census.h"
#include "kernels/common/census_math.h"

#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

// Reads every gradient once (4 or 2 bytes per element), writes nothing; 3 flops per element.
// partials[t]: gradient t's sum of squares of the unscaled values, in FP64.
void guard_partials(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, std::vector<double>& partials) {
  const float inv = scalar_value(inv_scale);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  static_assert(kReduceLanes == 8, "sum_squares_8 sums 8 chunks side by side");
  partials.assign(grads.size(), 0.0);
  for (size_t t = 0; t < grads.size(); ++t) {
    const Tensor* g = grads[t];
    const void* pg = g->data();
    // One read per element: the finite check and the square of the unscaled value together.
    // A non-finite element makes its square non-finite, so the sum carries the flag.
    // (The square of a float is exact in double, so the sum is the same fused or not.)
    // Whole groups of 8 chunks go to the active ISA's element kernel (the same sums, the
    // same bits, read 8 elements of each chunk at a time instead of one).
    const GemmElem elem = gemm_elem_of(g->dtype());
    const size_t elem_bytes = dtype_size(g->dtype());
    partials[t] = with_dtype(g->dtype(), [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      return deterministic_sum_grouped(
          g->numel(),
          [&](int64_t i) {
            const float u = ld<D>(pg, i) * inv;
            return (double)u * (double)u;
          },
          [&](int64_t base, double* out) {
            blocks_isa.sum_squares_8(static_cast<const char*>(pg) + base * elem_bytes, elem, kReduceChunk,
                                     kReduceChunk, inv, out);
          });
    });
  }
}

// The partials summed in gradient order: a sharded run (amp/dist) sums the same partials,
// gathered from their owners, in the same order, and so gets this norm's bits.
void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm) {
  thread_local std::vector<double> partials;  // kept: a steady step allocates nothing here
  guard_partials(grads, inv_scale, partials);
  double total = 0.0;
  bool nonfinite = false;
  for (double s : partials) {
    if (!std::isfinite(s)) nonfinite = true;
    total += s;
  }
  found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));  // one rounding, after the root
}

// The guard and, in the same read, the census of each gradient (engine/census.h). The sums of
// squares are the guard's, in its order, so found_inf and the norm keep their bits. Each
// group of 8 chunks counts into its own record (no two threads share one), merged after.
// Reads every gradient once; writes kCensusFields words per gradient; 3 more operations per
// 8 plain values (fewer in the wider scans), and where values sit below the normal range, on
// avx512 8 per 16 FP32 values or 6 per 32 FP16 values counted in FP16 (avx2: per 8 and 16;
// baseline: 8 per 4 FP32 values, 6 per 8 FP16 values; element_blocks.cpp).
void guard_census(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm,
                  const GuardCensus& census) {
  const float inv = scalar_value(inv_scale);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  const CensusBounds bounds = census_bounds(census.format == DType::BF16);
  constexpr int64_t kGroupSpan = kReduceChunk * kReduceLanes;
  uint32_t* words = census.out->data_as<uint32_t>();
  double total = 0.0;
  bool nonfinite = false;
  std::vector<CensusCounts> groups;
  for (size_t t = 0; t < grads.size(); ++t) {
    const Tensor* g = grads[t];
    const void* pg = g->data();
    const GemmElem elem = gemm_elem_of(g->dtype());
    const size_t elem_bytes = dtype_size(g->dtype());
    groups.assign(static_cast<size_t>((g->numel() + kGroupSpan - 1) / kGroupSpan), CensusCounts{});
    const double s = with_dtype(g->dtype(), [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      return deterministic_sum_grouped(
          g->numel(),
          [&](int64_t i) {
            const float v = ld<D>(pg, i);
            groups[static_cast<size_t>(i / kGroupSpan)].add(census_class(v, bounds), v);
            const float u = v * inv;
            return (double)u * (double)u;
          },
          [&](int64_t base, double* out) {
            blocks_isa.sum_squares_census_8(static_cast<const char*>(pg) + base * elem_bytes, elem, kReduceChunk,
                                            kReduceChunk, inv, bounds, out,
                                            &groups[static_cast<size_t>(base / kGroupSpan)]);
          });
    });
    if (!std::isfinite(s)) nonfinite = true;
    total += s;
    CensusCounts sum;
    for (const CensusCounts& c : groups) sum.merge(c);
    uint32_t* w = words + t * kCensusFields;
    w[kCensusNonfinite] = static_cast<uint32_t>(sum.nonfinite);  // each <= numel < 2^32 (backend_checks)
    w[kCensusZeros] = static_cast<uint32_t>(sum.zeros);
    w[kCensusUnderflow] = static_cast<uint32_t>(sum.underflow);
    w[kCensusSubnormal] = static_cast<uint32_t>(sum.subnormal);
    std::memcpy(&w[kCensusAmax], &sum.amax, sizeof(float));
  }
  found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));
}

void clip_coefficient(const Tensor& norm, float max_norm, Tensor& clip_coef) {
  clip_coef.data_as<float>()[0] = clip_coefficient_of(scalar_value(norm), max_norm);
}

// Reads and writes every gradient once.
void unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf) {
  const float inv = scalar_value(inv_scale);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  int bad = 0;
  for (Tensor* g : grads)
    bad |= map_blocks(
        *g, [&](int64_t, int64_t len, float* r, const float* v) { return blocks_isa.unscale(v, r, len, inv); }, *g);
  found_inf.data_as<float>()[0] = bad != 0 ? 1.0f : 0.0f;
}

}  // namespace belay::cpu
