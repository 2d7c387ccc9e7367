// The fused attention's backward in FP16 / BF16 on tensor cores (attention_kernels.cu has the
// overview; attention_backward.cu computes D = rowsum(dO o O) first and launches these), after
// FlashAttention-2 but with no atomic: two kernels of 4 warps on the forward's 64-row swizzled
// tiles (attention_tc.cuh), mma.sync m16n8k16 with FP32 accumulators, P recomputed from the
// forward's FP32 lse as P = exp2(S scale log2 e - lse log2 e).
//  - dK / dV: a block per (item, 64 keys), a warp per 16 keys. K and V are loaded once; Q and dO
//    stream by 64 queries at a time (cp.async, double-buffered, with the queries' lse and D),
//    from the first query tile that sees the block's first key (causal) to the last. Per tile:
//    S^T = K Q^T, dP^T = V dO^T, P^T and dS^T = P^T (dP^T - D) in FP32 on the accumulators, then
//    dV += P^T dO and dK += dS^T Q with P and dS rounded to the input dtype (mma's operands).
//  - dQ: a block per (item, 64 queries), a warp per 16 queries, Q and dO loaded once, K and V
//    streaming as in the forward (causal tiles past the diagonal never loaded): S = Q K^T,
//    dP = dO V^T, dS = P (dP - D), dQ += dS K.
// A warp's part of a tile wholly inside the mask skips the per-element mask test.
// The determinism rule: every output element is written once, by the one thread that holds its
// accumulator, after a sum over the query (or key) tiles in ascending order and, within a tile,
// mma's fixed order; no float atomics, so the bits repeat from run to run. The price is S and
// dP computed twice (once per kernel).
// Flops: 14 items Tq Tk d (7 products of 2 Tq Tk d each: S, dP, dV, dK here, S, dP, dQ there),
// half that causal: 3.5x the forward's, against 2.5x for FlashAttention-2's atomic dQ. Bytes (from L2 after
// the first reads): dK / dV reads K, V once and Q, dO (+ 8 bytes of lse and D per query) once per
// key tile; dQ reads Q, dO, lse, D once and K, V once per query tile; dQ, dK, dV written once
// each (FP32 or the input dtype).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace belay {
namespace {

using namespace attn;
using namespace ptx;

// One item's Q, dO, K and V as both kernels read them: rows of ld 16-bit values.
struct ItemInputs {
  const uint16_t* q;
  const uint16_t* dout;
  const uint16_t* k;
  const uint16_t* v;
};
__device__ __forceinline__ ItemInputs item_inputs(const BwdParams& p, int64_t item) {
  return {static_cast<const uint16_t*>(p.q) + item * p.tq * p.ld,
          static_cast<const uint16_t*>(p.dout) + item * p.tq * p.ld,
          static_cast<const uint16_t*>(p.k) + item * p.tk * p.ld,
          static_cast<const uint16_t*>(p.v) + item * p.tk * p.ld};
}

// dS = P (dP - D), the score gradient before the softmax, FP32.
__device__ __forceinline__ float score_grad(float p, float dp, float dsum) { return p * (dp - dsum); }

// Writes the warp's 16 rows (from row0) of an [rows][d] gradient, times `scale`, in its dtype.
template <int kD>
__device__ __forceinline__ void store_grad(void* g, DType dtype, const float (&acc)[kD / 8][4], float scale,
                                           int64_t item, int64_t row0, int64_t rows, int d, int lane) {
  BELAY_UNROLL
  for (int x = 0; x < kD / 8; ++x)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) {
      const gemm::Coord e = gemm::mma_c_element(lane, r);
      const int64_t row = row0 + e.row;
      const int col = x * gemm::kMmaN + e.col;
      if (row < rows && col < d) cuda::store_f32(g, dtype, (item * rows + row) * d + col, scale * acc[x][r]);
    }
}

template <int kD>
__device__ __forceinline__ void zero(float (&acc)[kD / 8][4]) {
  BELAY_UNROLL
  for (int x = 0; x < kD / 8; ++x)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) acc[x][r] = 0.0f;
}

// dK and dV of 64 keys. Shared memory: K, V, then Q and dO of stage 0 and 1, then the rows'
// floats (attention_layout.h: dkv_row_floats). 128 threads, one block per SM at least, as the
// forward (kD = 128 holds 128 gradient accumulators a thread).
template <int kD, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1) attention_dkv_tc_kernel(const BwdParams p) {
  BELAY_SHARED_DYNAMIC(uint16_t, smem, 128);
  // At kD = 128 the 128 accumulators of dK and dV leave no room for S^T and dP^T of all 64
  // queries (ptxas spilled): they are computed 32 queries at a time.
  constexpr int kSub = kD == 128 ? 2 : 1, kN = kKeyTilesN / kSub;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockTile bt = bwd_block_tile(blockIdx.x, p.items, p.tiles, false);
  const int64_t item = bt.item, j0 = bt.tile * kBc;
  const ItemInputs g = item_inputs(p, item);
  uint16_t* const k_s = smem;
  uint16_t* const v_s = smem + tile_elems(kD);
  auto q_s = [&](int stage) { return smem + (2 + stage) * tile_elems(kD); };
  auto g_s = [&](int stage) { return smem + (4 + stage) * tile_elems(kD); };
  float* const rows_s = reinterpret_cast<float*>(smem + kBwdTiles * tile_elems(kD));
  // The query tile's lse (log2 units) and D into stage `stage`: plain loads, one value a thread;
  // 0 past the last query (those are masked anyway).
  auto load_rows = [&](int stage, int64_t i0) {
    const bool dsum = threadIdx.x >= kBr;
    const int64_t i = i0 + threadIdx.x % kBr;
    float x = 0.0f;
    if (i < p.tq) x = dsum ? p.dsum[item * p.tq + i] : p.lse[item * p.tq + i] * kLog2e;
    rows_s[dkv_row_floats(stage, dsum) + threadIdx.x % kBr] = x;
  };
  const int64_t first = first_query_tile(p.causal, j0, p.tq, p.tk), last = ceil_div(p.tq, kBr);

  // Group 0: K, V and the first query tile.
  load_tile<kD>(k_s, g.k, j0, p.tk, p.ld);
  load_tile<kD>(v_s, g.v, j0, p.tk, p.ld);
  if (first < last) {
    load_tile<kD>(q_s(0), g.q, first * kBr, p.tq, p.ld);
    load_tile<kD>(g_s(0), g.dout, first * kBr, p.tq, p.ld);
    load_rows(0, first * kBr);
  }
  cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
  zero<kD>(dk);
  zero<kD>(dv);
  const int key0 = static_cast<int>(j0) + warp * gemm::kMmaM;  // the warp's first key
  const int tq = static_cast<int>(p.tq), tk = static_cast<int>(p.tk);
  for (int64_t qt = first; qt < last; ++qt) {
    const int stage = static_cast<int>((qt - first) % 2);
    // Prefetch query tile qt + 1 into the other stage (its last readers passed the barrier
    // that ended the previous tile), then wait for tile qt only.
    if (qt + 1 < last) {
      load_tile<kD>(q_s(stage ^ 1), g.q, (qt + 1) * kBr, p.tq, p.ld);
      load_tile<kD>(g_s(stage ^ 1), g.dout, (qt + 1) * kBr, p.tq, p.ld);
      load_rows(stage ^ 1, (qt + 1) * kBr);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // tile qt, its rows' floats (and K, V) visible to every warp

    // Rows are the warp's keys, columns the tile's queries, kSub parts of 64 / kSub queries.
    const float* lse2 = rows_s + dkv_row_floats(stage, false);
    const float* dsum = rows_s + dkv_row_floats(stage, true);
    const int i0 = static_cast<int>(qt) * kBr;
#pragma unroll 1
    for (int sub = 0; sub < kSub; ++sub) {
      float s[kN][4], dp[kN][4];
      tile_scores<kD, kBf16, kN>(s, k_s, q_s(stage), warp, lane, p.ld, sub * kN / 2);
      tile_scores<kD, kBf16, kN>(dp, v_s, g_s(stage), warp, lane, p.ld, sub * kN / 2);
      auto probs = [&](auto masked) {
        BELAY_UNROLL
        for (int ni = 0; ni < kN; ++ni)
          BELAY_UNROLL
          for (int r = 0; r < 4; ++r) {
            const ScorePos e = score_pos(lane, sub * kN + ni, r);  // e.row: the key, e.key: the query
            const bool live = !decltype(masked)::value || sees_in(p.causal, i0 + e.key, key0 + e.row, tq, tk);
            const float pij = live ? exp2f(s[ni][r] * p.scale_log2 - lse2[e.key]) : 0.0f;
            s[ni][r] = pij;
            dp[ni][r] = score_grad(pij, dp[ni][r], dsum[e.key]);
          }
      };
      // A part wholly inside the mask skips it (a branch uniform in the warp); not at kD = 128,
      // where the second copy of this loop cost sm_80 a spill (ptxas).
      if (kD == 64 && all_live(p.causal, i0 + sub * kN * gemm::kMmaN, kN * gemm::kMmaN, key0, gemm::kMmaM, tq, tk))
        probs(std::false_type{});
      else
        probs(std::true_type{});
      tile_pv<kD, kBf16, kN>(dv, s, g_s(stage), lane, p.ld, sub * kN / 2);   // dV += P^T dO
      tile_pv<kD, kBf16, kN>(dk, dp, q_s(stage), lane, p.ld, sub * kN / 2);  // dK += dS^T Q
    }
    __syncthreads();  // every warp done with this stage before tile qt + 2 is copied into it
  }
  cp_async_wait<0>();  // no copy left in flight
  store_grad<kD>(p.dk, p.dk_dtype, dk, p.scale, item, key0, p.tk, p.d, lane);
  store_grad<kD>(p.dv, p.dv_dtype, dv, 1.0f, item, key0, p.tk, p.d, lane);
}

// dQ of 64 queries. Shared memory: Q, dO, then K and V of stage 0 and 1.
template <int kD, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1) attention_dq_tc_kernel(const BwdParams p) {
  BELAY_SHARED_DYNAMIC(uint16_t, smem, 128);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockTile bt = bwd_block_tile(blockIdx.x, p.items, p.tiles, true);
  const int64_t item = bt.item, q0 = bt.tile * kBr;
  const ItemInputs g = item_inputs(p, item);
  uint16_t* const q_s = smem;
  uint16_t* const g_s = smem + tile_elems(kD);
  auto k_s = [&](int stage) { return smem + (2 + stage) * tile_elems(kD); };
  auto v_s = [&](int stage) { return smem + (4 + stage) * tile_elems(kD); };
  const int n_tiles = key_tiles(p.causal, q0, kBr, p.tq, p.tk, kBc);

  load_tile<kD>(q_s, g.q, q0, p.tq, p.ld);
  load_tile<kD>(g_s, g.dout, q0, p.tq, p.ld);
  if (n_tiles > 0) {
    load_tile<kD>(k_s(0), g.k, 0, p.tk, p.ld);
    load_tile<kD>(v_s(0), g.v, 0, p.tk, p.ld);
  }
  cp_async_commit();

  // The thread's two rows (h = 0: row g, 1: g + 8): lse in log2 units and D, in registers.
  const int q_row0 = static_cast<int>(q0) + warp * gemm::kMmaM;
  const int tq = static_cast<int>(p.tq), tk = static_cast<int>(p.tk);
  float lse2[2], dsum[2];
  BELAY_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int i = q_row0 + lane / 4 + 8 * h;
    lse2[h] = i < p.tq ? p.lse[item * p.tq + i] * kLog2e : 0.0f;
    dsum[h] = i < p.tq ? p.dsum[item * p.tq + i] : 0.0f;
  }
  float dq[kD / 8][4];
  zero<kD>(dq);
  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      load_tile<kD>(k_s((kt + 1) % 2), g.k, (kt + 1) * int64_t{kBc}, p.tk, p.ld);
      load_tile<kD>(v_s((kt + 1) % 2), g.v, (kt + 1) * int64_t{kBc}, p.tk, p.ld);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // tile kt (and Q, dO) visible to every warp

    float s[kKeyTilesN][4], dp[kKeyTilesN][4];
    tile_scores<kD, kBf16>(s, q_s, k_s(kt % 2), warp, lane, p.ld);
    tile_scores<kD, kBf16>(dp, g_s, v_s(kt % 2), warp, lane, p.ld);
    const int j0 = kt * kBc;
    auto grads = [&](auto masked) {
      BELAY_UNROLL
      for (int ni = 0; ni < kKeyTilesN; ++ni)
        BELAY_UNROLL
        for (int r = 0; r < 4; ++r) {
          const ScorePos e = score_pos(lane, ni, r);
          const bool live = !decltype(masked)::value || sees_in(p.causal, q_row0 + e.row, j0 + e.key, tq, tk);
          const float pij = live ? exp2f(s[ni][r] * p.scale_log2 - lse2[r / 2]) : 0.0f;
          dp[ni][r] = score_grad(pij, dp[ni][r], dsum[r / 2]);
        }
    };
    // A tile wholly inside the mask for the warp's rows skips it (a branch uniform in the warp).
    if (all_live(p.causal, q_row0, gemm::kMmaM, j0, kBc, tq, tk)) grads(std::false_type{});
    else grads(std::true_type{});
    tile_pv<kD, kBf16>(dq, dp, k_s(kt % 2), lane, p.ld);  // dQ += dS K
    __syncthreads();  // every warp done with stage kt % 2 before tile kt + 2 is copied into it
  }
  cp_async_wait<0>();
  store_grad<kD>(p.dq, p.dq_dtype, dq, p.scale, item, q_row0, p.tq, p.d, lane);
}

template <int kD, bool kBf16>
void launch_tc(BwdParams p) {
  constexpr auto dkv = attention_dkv_tc_kernel<kD, kBf16>;
  constexpr auto dq = attention_dq_tc_kernel<kD, kBf16>;
  configure_smem<dkv>(dkv_smem_bytes(kD));
  configure_smem<dq>(dq_smem_bytes(kD));
  p.tiles = static_cast<int>(ceil_div(p.tk, kBc));
  if (const int64_t blocks = p.items * p.tiles; blocks > 0)
    cuda::launch<dkv>(static_cast<unsigned>(blocks), kThreads, dkv_smem_bytes(kD), nullptr, p);
  p.tiles = static_cast<int>(ceil_div(p.tq, kBr));
  if (const int64_t blocks = p.items * p.tiles; blocks > 0)
    cuda::launch<dq>(static_cast<unsigned>(blocks), kThreads, dq_smem_bytes(kD), nullptr, p);
}

template <bool kBf16>
void launch_tc_dim(const BwdParams& p) {
  if (padded_head_dim(p.ld) == 64) launch_tc<64, kBf16>(p);
  else launch_tc<128, kBf16>(p);
}

}  // namespace

void attn::launch_backward_tc(BwdParams p) {
  if (p.dtype == DType::BF16) launch_tc_dim<true>(p);
  else launch_tc_dim<false>(p);
}

}  // namespace belay
