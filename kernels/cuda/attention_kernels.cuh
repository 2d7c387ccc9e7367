// What the fused attention's CUDA files share (attention_kernels.cu: the FP32 forward and the
// launchers; attention_forward_tc.cu: the FP16 / BF16 forward on tensor cores;
// attention_backward.cu: D, the FP32 backward and the backward's launcher;
// attention_backward_tc.cu: the FP16 / BF16 backward on tensor cores): the kernels' parameters,
// the SIMT row helpers and the tensor-core launchers. Index formulas are in attention_layout.h,
// checked on the CPU.
#pragma once
#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/attention_layout.h"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/simt_seam.cuh"

namespace belay {
namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t tq, tk;
  int d, ld;          // out's row length; the inputs' stored row length (>= d)
  int q_tiles;        // blocks per item
  float scale_log2;   // scale * log2(e): scores in log2 units, so exp is one exp2
  bool causal;
};

// The FP16 / BF16 forward (attention_forward_tc.cu): `blocks` blocks of kThreads.
void launch_forward_tc(const FwdParams& p, unsigned blocks, bool bf16);

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;  // rows of ld, as q
  const float* lse;
  const float* dsum;  // D = rowsum(dO o O), FP32
  void* dq;
  void* dk;
  void* dv;
  DType dtype, dq_dtype, dk_dtype, dv_dtype;
  int64_t items, tq, tk;
  int d, ld;  // the gradients' row length; the inputs' stored one (the SIMT kernels: ld == d)
  int tiles;  // blocks per item (query tiles for dQ, key tiles for dK / dV)
  float scale, scale_log2;
  bool causal;
};

// The FP16 / BF16 backward after D (attention_backward_tc.cu): the dK / dV kernel, then dQ.
void launch_backward_tc(BwdParams p);

// ---- The SIMT helpers: the FP32 forward and the backward --------------------------------
// A thread owns kD / 4 columns of its row (attention_layout.h: simt_col); a row's dot product
// is its 4 threads' parts added by an XOR tree, which gives all 4 the same bits.
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int kD>
__device__ __forceinline__ float row_dot(const float (&a)[kD / kLanesPerRow], const float* row, int sub) {
  float acc = 0.0f;
  BELAY_UNROLL
  for (int c = 0; c < kD / kLanesPerRow; ++c) acc += a[c] * row[simt_col(sub, c)];
  return row_sum(acc);
}

// Row `r` of one item's [rows][d] matrix (any dtype), the thread's columns, zero past d or rows.
template <int kD>
__device__ __forceinline__ void load_row(float (&dst)[kD / kLanesPerRow], const void* base, DType dtype, int64_t r,
                                         int64_t rows, int d, int sub) {
  BELAY_UNROLL
  for (int c = 0; c < kD / kLanesPerRow; ++c) {
    const int col = simt_col(sub, c);
    dst[c] = r < rows && col < d ? cuda::load_f32(base, dtype, r * d + col) : 0.0f;
  }
}

// Rows [row0, row0 + kSimtCols) of one item's [rows][d] matrix into a [kSimtCols][kD] FP32
// tile, zero past d or rows (so the padded columns add 0 to every dot product).
template <int kD>
__device__ __forceinline__ void load_simt_tile(float (*tile)[kD], const void* base, DType dtype, int64_t row0,
                                               int64_t rows, int d) {
  for (int e = threadIdx.x; e < kSimtCols * kD; e += kSimtThreads) {
    const int r = e / kD, c = e % kD;
    tile[r][c] = row0 + r < rows && c < d ? cuda::load_f32(base, dtype, (row0 + r) * d + c) : 0.0f;
  }
}

}  // namespace attn
}  // namespace belay
