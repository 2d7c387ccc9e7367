// The CPU backend's belts (kernels/cpu/cpu_kernels.h): the fused guard (found_inf and the
// global norm in one read of every gradient), the clip coefficient, the unfused unscale.
#include <cmath>

#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

// Reads every gradient once (4 or 2 bytes per element), writes nothing; 3 flops per element.
void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm) {
  const float inv = scalar_value(inv_scale);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  static_assert(kReduceLanes == 8, "sum_squares_8 sums 8 chunks side by side");
  double total = 0.0;
  bool nonfinite = false;
  for (const Tensor* g : grads) {
    const void* pg = g->data();
    // One read per element: the finite check and the square of the unscaled value together.
    // A non-finite element makes its square non-finite, so the sum carries the flag.
    // (The square of a float is exact in double, so the sum is the same fused or not.)
    // Whole groups of 8 chunks go to the active ISA's element kernel (the same sums, the
    // same bits, read 8 elements of each chunk at a time instead of one).
    const GemmElem elem = gemm_elem_of(g->dtype());
    const size_t elem_bytes = dtype_size(g->dtype());
    const double s = with_dtype(g->dtype(), [&](auto tag) {
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
    if (!std::isfinite(s)) nonfinite = true;
    total += s;
  }
  found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));  // one rounding, after the root
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
