// The CPU element kernels' inner loops, once per vector ISA (element_blocks.cpp, built by
// kernels/cpu/isa/isa.cmake with that path's -m flags and -ffp-contract=off): the 16-bit
// conversions, unscale-and-check, the AdamW and SGD updates of one block, LayerNorm and softmax rows and the activations (GELU
// through belay's own erf and exp, erf_exp.h, so they vectorize too). Every path does the same
// IEEE operations in the same order as kernels/common/element_math.h (GELU: its formula,
// with erf_exp.h's erf and exp in place of libm's; no FMA contraction, sqrt and division
// correctly rounded), so the paths agree bit for bit; only the width differs. tests/kernels/test_cpu_isa.cpp checks that on every path this CPU has.
#pragma once
#include <cstdint>

#include "kernels/common/census_math.h"  // CensusBounds
#include "kernels/cpu/isa/gemm_f32.h"      // GemmElem: an input's element type as stored

namespace belay {

// One AdamW block: g (the stored gradient, FP32), the master p and the moments m, v updated
// in place; w16, when not null, receives the FP16 working copy in the same pass.
struct AdamWBlock {
  const float* g;
  float *p, *m, *v;
  uint16_t* w16;
  int64_t len;
  float inv_scale, clip_coef;  // effective gradient = g * inv_scale * clip_coef
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2, weight_decay;
  bool stream;  // the working copy with non-temporal stores (tensors far larger than the caches)
};

// One SGD block: g (the stored gradient, FP32) and the master p updated in place, with the
// momentum buffer buf when not null (sgd_element of element_math.h on each element).
struct SgdBlock {
  const float* g;
  float *p, *buf;
  int64_t len;
  float inv_scale, clip_coef;  // effective gradient = g * inv_scale * clip_coef
  float lr, momentum, weight_decay;
};

// The census counts of a run of gradient elements (engine/census.h's classes), added to.
struct CensusCounts {
  uint64_t nonfinite = 0, zeros = 0, underflow = 0, subnormal = 0;
  float amax = 0.0f;
  // One value of class `cls` (census_class or cast_census_class; kCensusFields: normal).
  void add(int cls, float v) {
    nonfinite += cls == kCensusNonfinite;
    zeros += cls == kCensusZeros;
    underflow += cls == kCensusUnderflow;
    subnormal += cls == kCensusSubnormal;
    amax = census_amax(amax, v);
  }
  void merge(const CensusCounts& o) {
    nonfinite += o.nonfinite;
    zeros += o.zeros;
    underflow += o.underflow;
    subnormal += o.subnormal;
    amax = o.amax > amax ? o.amax : amax;
  }
};

struct ElementBlocks {
  void (*f32_to_f16)(const float* src, uint16_t* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  // r[j] = v[j] * inv (r may be v); returns 1 if any result is inf or NaN.
  int (*unscale)(const float* v, float* r, int64_t n, float inv);
  // Returns whether it wrote w16 (the wider paths do; baseline leaves it to the caller).
  bool (*adamw)(const AdamWBlock& b);
  void (*sgd)(const SgdBlock& b);
  // The activations of one block: y = f(x) and dx = dy * f'(x). y may be x and dx may be dy
  // (each element is read before it is written). ReLU keeps the backend's convention:
  // x > 0 ? x : 0, so NaN gives 0 (as the CUDA kernels do).
  void (*gelu)(const float* x, float* y, int64_t n);
  void (*gelu_grad)(const float* x, const float* dy, float* dx, int64_t n);
  void (*gelu_tanh)(const float* x, float* y, int64_t n);
  void (*gelu_tanh_grad)(const float* x, const float* dy, float* dx, int64_t n);
  void (*relu)(const float* x, float* y, int64_t n);
  void (*relu_grad)(const float* x, const float* dy, float* dx, int64_t n);
  // The guard's sums of squares for 8 chunks side by side, in the backend's fixed order
  // (cpu_backend.cpp, deterministic_sum): chunk k starts at element k * stride of x, and
  // out[k] = the sum over j in [0, len), in index order, in double, of u * u with
  // u = (float)(x[k * stride + j] * inv) rounded to FP32 first, x of type elem. len is a multiple of 8. The wider paths read 8 elements of each chunk and
  // transpose them, so each lane still adds its own chunk's squares in order: the
  // baseline's bits (the square of a float is exact in double).
  void (*sum_squares_8)(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, double* out);
  // The same sums of 8 chunks anywhere: chunk k's first element at x[k], its len elements
  // (any len) added in order onto out[k] (a chunk read in pieces sums as in one), the same
  // operations (the guard's batches of small gradients, kernels/cpu/guard_kernels.cpp).
  void (*sum_squares_8_at)(const void* const* x, GemmElem elem, int64_t len, float inv, double* out);
  // The same sums, the same bits, and the census of the first `lanes` chunks' len values as
  // stored (census_class, census_amax) into counts[0, lanes), which start at zero: a batch's
  // piece, in the same read. Returns how many of those chunks held a value off the normal
  // finite range; `dense` (a hint, the counts the same either way): count every chunk in the
  // loop in the first block, as where 3 or more chunks held such values the round before.
  int (*sum_squares_census_8_at)(const void* const* x, int lanes, GemmElem elem, int64_t len, float inv,
                                 CensusBounds bounds, bool dense, double* out, CensusCounts* counts);
  // The longest call of sum_squares_census_8_at worth making, in values of each chunk (the
  // guard's batches read in rounds of at most this many): the baseline path counts a round's
  // chunks again after summing them, from L1 in rounds of 1024 (8 x 4 KiB of FP32); the AVX
  // paths count in the summing loop, and a longer round only spreads their per-call work thinner.
  int64_t census_round;
  // The same sums, the same bits, and in the same read the census of the 8 chunks'
  // elements as stored (census_class and census_amax of kernels/common/census_math.h),
  // added into *counts. A separate entry, so the guard without a census runs the loop above.
  void (*sum_squares_census_8)(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv,
                               CensusBounds bounds, double* out, CensusCounts* counts);
  // LayerNorm of one row of n FP32 values (the backend's layer_norm): mean and variance summed
  // in FP32 over 16 lanes in a fixed order (the same on every path), y = (x - mean) rstd w + b.
  void (*layer_norm_row)(const float* x, const float* w, const float* b, int64_t n, float eps, float* y,
                         float* mean, float* rstd);
  // Its backward: dx of the row, and dy xhat and dy added into the double accumulators dw, db.
  void (*layer_norm_row_backward)(const float* x, const float* dy, const float* w, int64_t n, float mean, float rstd,
                                  float* dx, double* dw, double* db);
  // Softmax (log: log-softmax) of one row of n FP32 values whose columns [live, n) are masked
  // (the causal mask; live = n without one): the maximum subtracted, e^x through erf_exp.h's
  // exp_f32, the sum in double over 16 lanes in a fixed order (lane_sum). y may be x.
  void (*softmax_row)(const float* x, float* y, int64_t n, int64_t live, bool log);
  // Its backward from the output y: dx = y (dy - sum(dy y)), log: dy - e^y sum(dy); masked
  // columns get 0. dx may be dy.
  void (*softmax_row_backward)(const float* y, const float* dy, float* dx, int64_t n, int64_t live, bool log);
  // acc[j] += v[j] in double for j < n: sum_rows' column sums (the bias gradients), a row at a
  // time, each column adding its rows in order (the bits of a plain loop on every path).
  void (*add_row_f64)(const float* v, int64_t n, double* acc);
};

namespace isa_baseline { extern const ElementBlocks element_blocks; }
namespace isa_avx2 { extern const ElementBlocks element_blocks; }
namespace isa_avx512 { extern const ElementBlocks element_blocks; }

}  // namespace belay
