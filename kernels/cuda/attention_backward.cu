// The fused attention's backward (attention_kernels.cu has the overview): D = rowsum(dO o O)
// first, in every dtype; then for FP16 / BF16 the tensor-core kernels of
// attention_backward_tc.cu, and for FP32 the CUDA-core kernels below: one over key tiles for dK
// and dV, one over query tiles for dQ, each recomputing P from lse. Every sum has one fixed
// order and no output is written by two blocks: the bits repeat. Bytes: D reads dO and O once;
// then K, V re-read per query tile and Q, dO per key tile; flops 14 items Tq Tk d (S and dP
// computed in both kernels), 3.5x the forward's.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace belay {
namespace {

using namespace attn;

// D_i = sum_c dO_ic O_ic in FP32: a warp a row (its reads coalesced), lane l adding columns
// l, l + 32, ... in order, then a fixed XOR tree over the lanes. dO's rows are ld long (padded
// for the tensor cores), out's d.
__global__ void attention_dsum_kernel(const void* dout, const void* out, DType dtype, int64_t rows, int d, int ld,
                                      float* dsum) {
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32; r < rows; r += warps) {
    float acc = 0.0f;
    for (int c = lane; c < d; c += 32) acc += cuda::load_f32(dout, dtype, r * ld + c) * cuda::load_f32(out, dtype, r * d + c);
    BELAY_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) dsum[r] = acc;
  }
}

// p_ij = exp(scale q_i.k_j - lse_i) recomputed (0 where masked); dS_ij = p_ij (dO_i.v_j - D_i).
struct ProbGrad {
  float p, ds;
};
__device__ __forceinline__ ProbGrad prob_grad(bool live, float qk, float dp, float lse2, float dsum, float scale_log2) {
  const float pij = live ? exp2f(qk * scale_log2 - lse2) : 0.0f;
  return {pij, pij * (dp - dsum)};
}

// dQ_i = scale sum_j dS_ij k_j, keys in order: a block per (item, 32 queries).
template <int kD>
__global__ void __launch_bounds__(kSimtThreads) attention_dq_kernel(const BwdParams p) {
  BELAY_SHARED(float, k_s, [kSimtCols][kD]);
  BELAY_SHARED(float, v_s, [kSimtCols][kD]);
  constexpr int kCols = kD / kLanesPerRow;
  const SimtLane me = simt_lane(threadIdx.x);
  const int64_t item = blockIdx.x / p.tiles, q0 = static_cast<int64_t>(blockIdx.x % p.tiles) * kSimtRows;
  const int64_t i = q0 + me.row, row = item * p.tq + i;
  const int64_t qsz = p.dtype == DType::F32 ? 4 : 2;
  const void* gq = static_cast<const char*>(p.q) + item * p.tq * p.d * qsz;
  const void* gg = static_cast<const char*>(p.dout) + item * p.tq * p.d * qsz;
  const void* gk = static_cast<const char*>(p.k) + item * p.tk * p.d * qsz;
  const void* gv = static_cast<const char*>(p.v) + item * p.tk * p.d * qsz;
  float q[kCols], g[kCols], dq[kCols];
  load_row<kD>(q, gq, p.dtype, i, p.tq, p.d, me.sub);
  load_row<kD>(g, gg, p.dtype, i, p.tq, p.d, me.sub);
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c) dq[c] = 0.0f;
  const float lse2 = i < p.tq ? p.lse[row] * kLog2e : 0.0f, dsum = i < p.tq ? p.dsum[row] : 0.0f;

  const int n_tiles = key_tiles(p.causal, q0, kSimtRows, p.tq, p.tk, kSimtCols);
  for (int kt = 0; kt < n_tiles; ++kt) {
    const int64_t j0 = kt * int64_t{kSimtCols};
    __syncthreads();
    load_simt_tile<kD>(k_s, gk, p.dtype, j0, p.tk, p.d);
    load_simt_tile<kD>(v_s, gv, p.dtype, j0, p.tk, p.d);
    __syncthreads();
    for (int jj = 0; jj < kSimtCols; ++jj) {
      const float qk = row_dot<kD>(q, k_s[jj], me.sub), dp = row_dot<kD>(g, v_s[jj], me.sub);
      const bool live = i < p.tq && sees(p.causal, i, j0 + jj, p.tq, p.tk);
      const ProbGrad pg = prob_grad(live, qk, dp, lse2, dsum, p.scale_log2);
      BELAY_UNROLL
      for (int c = 0; c < kCols; ++c) dq[c] += pg.ds * k_s[jj][simt_col(me.sub, c)];
    }
  }
  if (i >= p.tq) return;
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c)
    if (simt_col(me.sub, c) < p.d) cuda::store_f32(p.dq, p.dq_dtype, row * p.d + simt_col(me.sub, c), p.scale * dq[c]);
}

// dK_j = scale sum_i dS_ij q_i and dV_j = sum_i p_ij dO_i, queries in order: a block per
// (item, 32 keys), starting at the first query that sees its first key.
template <int kD>
__global__ void __launch_bounds__(kSimtThreads) attention_dkv_kernel(const BwdParams p) {
  BELAY_SHARED(float, q_s, [kSimtCols][kD]);
  BELAY_SHARED(float, g_s, [kSimtCols][kD]);
  BELAY_SHARED(float, lse_s, [kSimtCols]);
  BELAY_SHARED(float, dsum_s, [kSimtCols]);
  constexpr int kCols = kD / kLanesPerRow;
  const SimtLane me = simt_lane(threadIdx.x);
  const int64_t item = blockIdx.x / p.tiles, j0 = static_cast<int64_t>(blockIdx.x % p.tiles) * kSimtRows;
  const int64_t j = j0 + me.row;
  const int64_t qsz = p.dtype == DType::F32 ? 4 : 2;
  const void* gq = static_cast<const char*>(p.q) + item * p.tq * p.d * qsz;
  const void* gg = static_cast<const char*>(p.dout) + item * p.tq * p.d * qsz;
  const void* gk = static_cast<const char*>(p.k) + item * p.tk * p.d * qsz;
  const void* gv = static_cast<const char*>(p.v) + item * p.tk * p.d * qsz;
  float k[kCols], v[kCols], dk[kCols], dv[kCols];
  load_row<kD>(k, gk, p.dtype, j, p.tk, p.d, me.sub);
  load_row<kD>(v, gv, p.dtype, j, p.tk, p.d, me.sub);
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c) dk[c] = dv[c] = 0.0f;

  const int64_t first_tile = first_query(p.causal, j0, p.tq, p.tk) / kSimtCols;
  const int64_t q_tiles = ceil_div(p.tq, kSimtCols);
  for (int64_t qt = first_tile; qt < q_tiles; ++qt) {
    const int64_t i0 = qt * kSimtCols;
    __syncthreads();
    load_simt_tile<kD>(q_s, gq, p.dtype, i0, p.tq, p.d);
    load_simt_tile<kD>(g_s, gg, p.dtype, i0, p.tq, p.d);
    if (threadIdx.x < kSimtCols) {
      const int64_t i = i0 + threadIdx.x, row = item * p.tq + i;
      lse_s[threadIdx.x] = i < p.tq ? p.lse[row] * kLog2e : 0.0f;
      dsum_s[threadIdx.x] = i < p.tq ? p.dsum[row] : 0.0f;
    }
    __syncthreads();
    for (int ii = 0; ii < kSimtCols; ++ii) {
      const float qk = row_dot<kD>(k, q_s[ii], me.sub), dp = row_dot<kD>(v, g_s[ii], me.sub);
      const bool live = i0 + ii < p.tq && sees(p.causal, i0 + ii, j, p.tq, p.tk);
      const ProbGrad pg = prob_grad(live, qk, dp, lse_s[ii], dsum_s[ii], p.scale_log2);
      BELAY_UNROLL
      for (int c = 0; c < kCols; ++c) {
        dv[c] += pg.p * g_s[ii][simt_col(me.sub, c)];
        dk[c] += pg.ds * q_s[ii][simt_col(me.sub, c)];
      }
    }
  }
  if (j >= p.tk) return;
  const int64_t row = item * p.tk + j;
  BELAY_UNROLL
  for (int c = 0; c < kCols; ++c) {
    const int col = simt_col(me.sub, c);
    if (col >= p.d) continue;
    cuda::store_f32(p.dk, p.dk_dtype, row * p.d + col, p.scale * dk[c]);
    cuda::store_f32(p.dv, p.dv_dtype, row * p.d + col, dv[c]);
  }
}

}  // namespace

void launch_attention_backward(const AttentionProblem& a, const void* out, const float* lse, const void* dout,
                               float* dsum, void* dq, DType dq_dtype, void* dk, DType dk_dtype, void* dv,
                               DType dv_dtype) {
  const int64_t rows = a.items * a.tq;
  if (rows > 0)
    cuda::launch<attention_dsum_kernel>(cuda::grid_for(rows * 32), cuda::kBlock, 0, nullptr, dout, out, a.dtype, rows,
                                        static_cast<int>(a.d), static_cast<int>(a.ld), dsum);
  BwdParams p{a.q, a.k, a.v, dout, lse, dsum, dq, dk, dv, a.dtype, dq_dtype, dk_dtype, dv_dtype, a.items, a.tq, a.tk,
              static_cast<int>(a.d), static_cast<int>(a.ld), 0, a.scale, a.scale * kLog2e, a.causal};
  if (a.dtype != DType::F32) {  // the tensor cores (attention_backward_tc.cu), every d as the forward
    launch_backward_tc(p);
    return;
  }
  const int kd = simt_head_dim(a.d);
  p.tiles = static_cast<int>(ceil_div(a.tq, kSimtRows));
  if (const unsigned grid = static_cast<unsigned>(a.items * p.tiles); grid > 0) {
    if (kd == 32) cuda::launch<attention_dq_kernel<32>>(grid, kSimtThreads, 0, nullptr, p);
    else if (kd == 64) cuda::launch<attention_dq_kernel<64>>(grid, kSimtThreads, 0, nullptr, p);
    else cuda::launch<attention_dq_kernel<128>>(grid, kSimtThreads, 0, nullptr, p);
  }
  p.tiles = static_cast<int>(ceil_div(a.tk, kSimtRows));
  if (const unsigned grid = static_cast<unsigned>(a.items * p.tiles); grid > 0) {
    if (kd == 32) cuda::launch<attention_dkv_kernel<32>>(grid, kSimtThreads, 0, nullptr, p);
    else if (kd == 64) cuda::launch<attention_dkv_kernel<64>>(grid, kSimtThreads, 0, nullptr, p);
    else cuda::launch<attention_dkv_kernel<128>>(grid, kSimtThreads, 0, nullptr, p);
  }
}

}  // namespace belay
