// The tile steps the tensor-core attention kernels share (attention_forward_tc.cu,
// attention_backward_tc.cu), all on [64][kD] swizzled shared-memory tiles of FP16 / BF16 rows
// (attention_layout.h) and mma.sync m16n8k16 with FP32 accumulators, a warp owning 16 rows:
//  - load_tile: 64 rows of a [rows][ld] matrix into a tile, by cp.async;
//  - tile_scores: X Y^T for the warp's 16 rows of tile X against the 64 rows of tile Y
//    (S = Q K^T and dP = dO V^T in the forward and dQ; S^T = K Q^T and dP^T = V dO^T in dK / dV);
//  - tile_pv: O += P Y with P the 16 x 64 accumulators of tile_scores rounded to the dtype and
//    Y a tile (O += P V; dQ += dS K; dV += P^T dO and dK += dS^T Q).
#pragma once
#include <cstdint>

#include "kernels/cuda/attention_layout.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/simt_seam.cuh"

namespace belay::attn {

// Copies rows [row0, row0 + 64) of one item's [rows][ld] matrix into a swizzled [64][kD] tile;
// chunks past the rows or past ld are zero-filled (0 source bytes).
template <int kD>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* g, int64_t row0, int64_t rows, int ld) {
  BELAY_UNROLL
  for (int pass = 0; pass < load_passes(kD); ++pass) {
    const TileChunk c = tile_chunk(threadIdx.x, pass, kD);
    const bool inside = chunk_inside(c, static_cast<int>(row0), static_cast<int>(rows), ld);
    const uint16_t* src = inside ? g + (row0 + c.row) * ld + c.chunk * kChunkElems : g;
    ptx::cp_async_16(ptx::smem_addr(tile + c.dst), src, inside ? 16 : 0);
  }
}

// s = X Y^T for the warp's 16 rows of tile x_s and 8 kN rows of tile y_s from row 16 pair0 (all
// 64 by default), FP32; both stored [row][d]: X is mma's K-major A, Y its K-major B. At kD = 64
// the d steps past the stored row (zero padding of d = 16, 32, 40 ... up to 64) are skipped: a
// branch uniform in the warp. Not at kD = 128: there the early exits cost sm_80 a spill
// (ptxas), for a saving only when 64 < d <= 112.
template <int kD, bool kBf16, int kN = kKeyTilesN>
__device__ __forceinline__ void tile_scores(float (&s)[kN][4], const uint16_t* x_s, const uint16_t* y_s, int warp,
                                            int lane, int ld, int pair0 = 0) {
  BELAY_UNROLL
  for (int ni = 0; ni < kN; ++ni)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) s[ni][r] = 0.0f;
  BELAY_UNROLL
  for (int kk = 0; kk < kD; kk += gemm::kMmaK) {
    if (kD == 64 && kk >= ld) break;
    uint32_t a[4];
    ptx::ldmatrix_x4<false>(a, ptx::smem_addr(x_s + q_ldsm_offset(lane, warp, kk, kD)));
    BELAY_UNROLL
    for (int pair = 0; pair < kN / 2; ++pair) {
      uint32_t r[4];
      ptx::ldmatrix_x4<false>(r, ptx::smem_addr(y_s + k_ldsm_offset(lane, pair0 + pair, kk, kD)));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      ptx::mma_16816<kBf16>(s[2 * pair], a, b0);
      ptx::mma_16816<kBf16>(s[2 * pair + 1], a, b1);
    }
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const uint32_t a = kBf16 ? f32_to_bf16_bits(lo) : f32_to_f16_bits(lo);
  const uint32_t b = kBf16 ? f32_to_bf16_bits(hi) : f32_to_f16_bits(hi);
  return a | (b << 16);
}

// o += P Y for the warp's 16 rows: P is s (16 x 8 kN, as tile_scores left it) and Y the 8 kN
// rows of tile y_s from row 16 pair0 ([row][d]: mma's N-major B, through ldmatrix.trans). P is rounded to the input dtype
// here, as FlashAttention-2 does, because mma.sync takes 16-bit operands (the forward's row sum
// l is of the unrounded P, so out carries one extra relative error of the dtype's unit roundoff
// per term, measured against FP64 by tests/gpu/test_cuda_attention.cpp). The accumulators are
// already where P's A fragment wants them (attention_layout.h: p_score_tile), so P never
// leaves the registers.
template <int kD, bool kBf16, int kN = kKeyTilesN>
__device__ __forceinline__ void tile_pv(float (&o)[kD / 8][4], const float (&s)[kN][4], const uint16_t* y_s, int lane,
                                        int ld, int pair0 = 0) {
  BELAY_UNROLL
  for (int kt2 = 0; kt2 < kN / 2; ++kt2) {
    uint32_t a[4];
    BELAY_UNROLL
    for (int ar = 0; ar < 4; ++ar)
      a[ar] = pack_pair<kBf16>(s[p_score_tile(kt2, ar)][p_score_reg(ar, 0)], s[p_score_tile(kt2, ar)][p_score_reg(ar, 1)]);
    BELAY_UNROLL
    for (int pair = 0; pair < kD / 16; ++pair) {
      if (kD == 64 && pair * 16 >= ld) break;  // the d padding (as in tile_scores): o there stays 0, unstored
      uint32_t r[4];
      ptx::ldmatrix_x4<true>(r, ptx::smem_addr(y_s + v_ldsm_offset(lane, pair, (pair0 + kt2) * gemm::kMmaK, kD)));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      ptx::mma_16816<kBf16>(o[2 * pair], a, b0);
      ptx::mma_16816<kBf16>(o[2 * pair + 1], a, b1);
    }
  }
}

// 80 KiB or more of dynamic shared memory needs the opt-in; set once per kernel.
template <auto kernel>
void configure_smem(int bytes) {
  static const bool configured = [bytes] {
    BELAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
}

}  // namespace belay::attn
