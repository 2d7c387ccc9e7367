// The fused attention on the GPU (engine/backend.h; docs/attention.md, section CUDA), after
// FlashAttention-2. Every index formula is in attention_layout.h, checked on the CPU.
//  - Forward, FP16 / BF16 (attention_forward_tc_kernel): a block per (item, 64 queries), a warp
//    per 16 of them. The block's Q tile and a double-buffered pair of K / V tiles (64 keys)
//    go through cp.async into swizzled shared memory; S = Q K^T and O += P V run on mma.sync
//    m16n8k16 fed by ldmatrix, FP32 accumulators; the online softmax (running max and sum per
//    row, FP32, in log2 units: scale * log2 e is folded into the scores) rescales O as keys
//    stream by. Causal key tiles past the block's last query are never loaded. O is rounded
//    once into out's dtype, lse written in FP32.
//  - Forward, FP32 (attention_forward_simt_kernel): the same algorithm on CUDA cores (no TF32:
//    an FP32 caller asks for FP32 products), 32 queries a block, 4 threads a query.
//  - Backward: D = rowsum(dO o O) first (every dtype), then one kernel over key tiles for dK
//    and dV and one over query tiles for dQ, each recomputing P from lse: for FP16 / BF16 on
//    tensor cores (attention_backward_tc.cu: 64 keys or 64 queries a block, a warp per 16, the
//    forward's tiles and mma.sync), for FP32 on CUDA cores (32 a block, 4 threads a row). Every
//    sum has one fixed order, and no output is written by two blocks: the bits repeat.
// Bytes (forward): Q, out once, K and V once per query tile (from L2 after the first);
// flops: 4 items Tq Tk d (half that causal). Backward: K, V re-read per query tile and Q, dO
// per key tile; flops 14 items Tq Tk d, 3.5x the forward's (S and dP computed in both kernels).
// Files: attention_forward_tc.cu (the tensor-core forward), attention_backward_tc.cu (the
// tensor-core backward), attention_tc.cuh (their shared tile steps), attention_backward.cu (D,
// the FP32 backward, the backward's launcher), this one (the FP32 forward and the forward's
// launcher); attention_kernels.cuh what they share.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace belay {
namespace {

using namespace attn;

template <int kD>
__global__ void __launch_bounds__(kSimtThreads) attention_forward_simt_kernel(const FwdParams p) {
  BELAY_SHARED(float, k_s, [kSimtCols][kD]);
  BELAY_SHARED(float, v_s, [kSimtCols][kD]);
  constexpr int kCols = kD / kLanesPerRow;
  const SimtLane me = simt_lane(threadIdx.x);
  const int64_t item = blockIdx.x / p.q_tiles, q0 = static_cast<int64_t>(blockIdx.x % p.q_tiles) * kSimtRows;
  const int64_t i = q0 + me.row;
  const float* gk = static_cast<const float*>(p.k) + item * p.tk * p.d;
  const float* gv = static_cast<const float*>(p.v) + item * p.tk * p.d;
  float q[kCols], o[kCols], m = -INFINITY, l = 0.0f;
  load_row<kD>(q, static_cast<const float*>(p.q) + item * p.tq * p.d, DType::F32, i, p.tq, p.d, me.sub);
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c) o[c] = 0.0f;

  const int n_tiles = key_tiles(p.causal, q0, kSimtRows, p.tq, p.tk, kSimtCols);
  for (int kt = 0; kt < n_tiles; ++kt) {
    const int64_t j0 = kt * int64_t{kSimtCols};
    __syncthreads();  // every thread done with the previous tile
    load_simt_tile<kD>(k_s, gk, DType::F32, j0, p.tk, p.d);
    load_simt_tile<kD>(v_s, gv, DType::F32, j0, p.tk, p.d);
    __syncthreads();
    float s[kSimtCols], mx = m;
    BELAY_UNROLL
    for (int jj = 0; jj < kSimtCols; ++jj) {
      const float dot = row_dot<kD>(q, k_s[jj], me.sub);
      s[jj] = sees(p.causal, i, j0 + jj, p.tq, p.tk) ? dot * p.scale_log2 : -INFINITY;
      mx = fmaxf(mx, s[jj]);
    }
    const float base = mx == -INFINITY ? 0.0f : mx, alpha = exp2f(m - base);
    m = mx;
    l *= alpha;
    BELAY_UNROLL
    for (int c = 0; c < kCols; ++c) o[c] *= alpha;
    BELAY_UNROLL
    for (int jj = 0; jj < kSimtCols; ++jj) {
      const float pj = exp2f(s[jj] - base);  // FP32: no rounding of P on this path
      l += pj;
      BELAY_UNROLL
      for (int c = 0; c < kCols; ++c) o[c] += pj * v_s[jj][simt_col(me.sub, c)];
    }
  }
  if (i >= p.tq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* out = static_cast<float*>(p.out) + (item * p.tq + i) * p.d;
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c)
    if (simt_col(me.sub, c) < p.d) out[simt_col(me.sub, c)] = o[c] * inv;
  if (me.sub == 0) p.lse[item * p.tq + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

}  // namespace

void launch_attention_forward(const AttentionProblem& a, void* out, float* lse) {
  const bool tc = a.dtype != DType::F32;
  FwdParams p{a.q, a.k, a.v, out, lse, a.tq, a.tk, static_cast<int>(a.d), static_cast<int>(a.ld), 0,
              a.scale * kLog2e, a.causal};
  p.q_tiles = static_cast<int>(ceil_div(a.tq, tc ? kBr : kSimtRows));
  const int64_t blocks = a.items * p.q_tiles;
  if (blocks == 0) return;
  const unsigned grid = static_cast<unsigned>(blocks);
  if (tc) launch_forward_tc(p, grid, a.dtype == DType::BF16);
  else if (simt_head_dim(a.d) == 32) cuda::launch<attention_forward_simt_kernel<32>>(grid, kSimtThreads, 0, nullptr, p);
  else if (simt_head_dim(a.d) == 64) cuda::launch<attention_forward_simt_kernel<64>>(grid, kSimtThreads, 0, nullptr, p);
  else cuda::launch<attention_forward_simt_kernel<128>>(grid, kSimtThreads, 0, nullptr, p);
}

}  // namespace belay
