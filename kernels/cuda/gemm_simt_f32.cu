// The FP32 GEMM (--dtype fp32): CUDA cores, FP32 FMA. A block of 256 threads computes a
// 64 x 64 tile of C; per k-tile of 16 it stages op(A) and op(B) in shared memory as
// [k][m] and [k][n], so the inner loop reads a row of each (broadcast for A, consecutive
// for B: conflict-free) and each thread updates a 4 x 4 micro-tile strided by 16
// (gemm_layout.h, f32_element). Global loads follow the stored layout (the contiguous
// index runs across threads) whichever of trans_a / trans_b is set. Edges are predicated.
// Simple on purpose: FP32 training is the reference path, not the fast one.
// Bytes: (M*K*N/64 + K*N*M/64) * 4 (mostly L2) + M*N*|C|; flops: 2*M*N*K.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/gemm_kernels.h"
#include "kernels/cuda/gemm_layout.h"

namespace belay {
namespace {

using namespace gemm;

struct F32Params {
  const float* a;
  const float* b;
  void* c;
  const void* bias;
  int64_t lda, ldb, m, n, k;
  int64_t stride_a, stride_b;  // batch item strides (elements); C's is m * n
  bool trans_a, trans_b, accumulate;
  DType c_dtype, bias_dtype;
};

__global__ void __launch_bounds__(kF32Threads) gemm_f32_kernel(const F32Params p) {
  // Rows of 66 floats: a warp's store of a k-contiguous operand is (k 0..15) x (m, m+1), and
  // with a row stride of 2 banks those 32 words fall in 32 different banks (a stride of 65, one
  // bank, put the two half-warps on 15 common banks: 2 wavefronts, as the emulator's memory
  // metrics counted); an m-contiguous operand's 32 consecutive m stay conflict-free.
  BELAY_SHARED(float, as, [kF32BK][kF32Tile + 2]);
  BELAY_SHARED(float, bs, [kF32BK][kF32Tile + 2]);
  // Batch item blockIdx.z: its operands, as if it were the only product.
  const float* pa = p.a + blockIdx.z * p.stride_a;
  const float* pb = p.b + blockIdx.z * p.stride_b;
  const int64_t c0 = blockIdx.z * p.m * p.n;
  const int t = threadIdx.x;
  const int64_t bm = blockIdx.y, bn = blockIdx.x;
  const int64_t m0 = bm * kF32Tile, n0 = bn * kF32Tile;
  float acc[kF32Micro][kF32Micro] = {};

  for (int64_t k0 = 0; k0 < p.k; k0 += kF32BK) {
    // 64 x 16 = 1024 elements per operand, 4 per thread.
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int id = r * kF32Threads + t;
      // A: stored [M][K] (k contiguous) or [K][M] (m contiguous).
      const int am = p.trans_a ? id % kF32Tile : id / kF32BK;
      const int ak = p.trans_a ? id / kF32Tile : id % kF32BK;
      const int64_t gm = m0 + am, gk = k0 + ak;
      float va = 0.0f;
      if (gm < p.m && gk < p.k) va = p.trans_a ? pa[gk * p.lda + gm] : pa[gm * p.lda + gk];
      as[ak][am] = va;
      // B: stored [K][N] (n contiguous) or [N][K] (k contiguous).
      const int bnn = p.trans_b ? id / kF32BK : id % kF32Tile;
      const int bk = p.trans_b ? id % kF32BK : id / kF32Tile;
      const int64_t gn = n0 + bnn, gk2 = k0 + bk;
      float vb = 0.0f;
      if (gn < p.n && gk2 < p.k) vb = p.trans_b ? pb[gn * p.ldb + gk2] : pb[gk2 * p.ldb + gn];
      bs[bk][bnn] = vb;
    }
    __syncthreads();
    BELAY_UNROLL
    for (int kk = 0; kk < kF32BK; ++kk) {
      float a[kF32Micro], b[kF32Micro];
      BELAY_UNROLL
      for (int i = 0; i < kF32Micro; ++i) a[i] = as[kk][t / 16 + 16 * i];
      BELAY_UNROLL
      for (int j = 0; j < kF32Micro; ++j) b[j] = bs[kk][t % 16 + 16 * j];
      BELAY_UNROLL
      for (int i = 0; i < kF32Micro; ++i)
        BELAY_UNROLL
        for (int j = 0; j < kF32Micro; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }

  BELAY_UNROLL
  for (int i = 0; i < kF32Micro; ++i)
    BELAY_UNROLL
    for (int j = 0; j < kF32Micro; ++j) {
      const Coord64 e = f32_element(bm, bn, t, i, j);
      if (e.row >= p.m || e.col >= p.n) continue;
      const int64_t idx = c0 + e.row * p.n + e.col;
      float v = acc[i][j];
      if (p.accumulate) v = static_cast<const float*>(p.c)[idx] + v;
      if (p.bias) v += cuda::load_f32(p.bias, p.bias_dtype, e.col);
      cuda::store_f32(p.c, p.c_dtype, idx, v);
    }
}

}  // namespace

void launch_gemm_simt_f32(const GemmProblem& g) {
  F32Params p{static_cast<const float*>(g.a), static_cast<const float*>(g.b), g.c, g.bias, g.lda, g.ldb, g.m, g.n,
              g.k, g.stride_a, g.stride_b, g.trans_a, g.trans_b, g.beta == 1.0f, g.c_dtype, g.bias_dtype};
  const dim3 grid(static_cast<unsigned>(ceil_div(g.n, kF32Tile)), static_cast<unsigned>(ceil_div(g.m, kF32Tile)),
                  static_cast<unsigned>(g.batch));
  cuda::launch<gemm_f32_kernel>(grid, kF32Threads, 0, nullptr, p);
}

}  // namespace belay
