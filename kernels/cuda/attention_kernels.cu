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
//  - Backward (every dtype, CUDA cores): D = rowsum(dO o O) first, then one kernel over key
//    tiles for dK and dV and one over query tiles for dQ, each recomputing P from lse. Every
//    sum has one fixed order, and no output is written by two blocks: the bits repeat.
// Bytes (forward): Q, out once, K and V once per query tile (from L2 after the first);
// flops: 4 items Tq Tk d (half that causal). Backward: K, V re-read per query tile and Q, dO
// per key tile; flops 2.5x the forward's (S and dP recomputed in both kernels).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_layout.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/simt_seam.cuh"

namespace belay {
namespace {

using namespace attn;
using namespace ptx;

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

// ---- The tensor-core forward -----------------------------------------------------------

// Copies rows [row0, row0 + 64) of one item's [rows][ld] matrix into a swizzled [64][kD] tile;
// chunks past the rows or past ld are zero-filled (0 source bytes).
template <int kD>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* g, int64_t row0, int64_t rows, int ld) {
#pragma unroll
  for (int pass = 0; pass < load_passes(kD); ++pass) {
    const TileChunk c = tile_chunk(threadIdx.x, pass, kD);
    const bool inside = chunk_inside(c, static_cast<int>(row0), static_cast<int>(rows), ld);
    const uint16_t* src = inside ? g + (row0 + c.row) * ld + c.chunk * kChunkElems : g;
    cp_async_16(smem_addr(tile + c.dst), src, inside ? 16 : 0);
  }
}

// S = Q K^T for the warp's 16 queries and the tile's 64 keys, FP32. At kD = 64 the d steps past
// the stored row (zero padding of d = 16, 32, 40 ... up to 64) are skipped: a branch uniform in
// the warp. Not at kD = 128: there the early exits cost sm_80 a spill (ptxas), for a saving
// only when 64 < d <= 112.
template <int kD, bool kBf16>
__device__ __forceinline__ void tile_scores(float (&s)[kKeyTilesN][4], const uint16_t* q_s, const uint16_t* k_s,
                                            int warp, int lane, int ld) {
#pragma unroll
  for (int ni = 0; ni < kKeyTilesN; ++ni)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[ni][r] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD; kk += gemm::kMmaK) {
    if (kD == 64 && kk >= ld) break;
    uint32_t a[4];
    ldmatrix_x4<false>(a, smem_addr(q_s + q_ldsm_offset(lane, warp, kk, kD)));
#pragma unroll
    for (int pair = 0; pair < kKeyTilesN / 2; ++pair) {
      uint32_t r[4];
      ldmatrix_x4<false>(r, smem_addr(k_s + k_ldsm_offset(lane, pair, kk, kD)));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816<kBf16>(s[2 * pair], a, b0);
      mma_16816<kBf16>(s[2 * pair + 1], a, b1);
    }
  }
}

// The online softmax over one key tile, for the thread's two rows (h = 0: row g, 1: g + 8):
// masked scores become -inf, the running max m moves to the tile's, O and the running sum l
// are rescaled by exp2(m_old - m_new), and s becomes exp2(s - m_new). l stays this thread's
// part of the row (its 16 of the tile's 64 keys); the 4 threads of a row add theirs at the end.
// The parameters by value: a reference into the kernel's parameter struct costs local memory.
template <int kD>
__device__ __forceinline__ void online_softmax(float (&s)[kKeyTilesN][4], float (&o)[kD / 8][4], float (&m)[2],
                                               float (&l)[2], bool causal, int64_t tq, int64_t tk,
                                               float scale_log2, int64_t q_row0, int64_t j0, int lane) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int ni = 0; ni < kKeyTilesN; ++ni)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const ScorePos e = score_pos(lane, ni, r);
      const bool live = sees(causal, q_row0 + e.row, j0 + e.key, tq, tk);
      s[ni][r] = live ? s[ni][r] * scale_log2 : -INFINITY;
      mx[r / 2] = fmaxf(mx[r / 2], s[ni][r]);
    }
  float base[2], alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    base[h] = mx[h] == -INFINITY ? 0.0f : mx[h];  // a row that has seen no key yet: no inf - inf
    alpha[h] = exp2f(m[h] - base[h]);
    m[h] = mx[h];
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int ni = 0; ni < kKeyTilesN; ++ni)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      s[ni][r] = exp2f(s[ni][r] - base[r / 2]);
      sum[r / 2] += s[ni][r];
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
#pragma unroll
  for (int x = 0; x < kD / 8; ++x)
#pragma unroll
    for (int r = 0; r < 4; ++r) o[x][r] *= alpha[r / 2];
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const uint32_t a = kBf16 ? f32_to_bf16_bits(lo) : f32_to_f16_bits(lo);
  const uint32_t b = kBf16 ? f32_to_bf16_bits(hi) : f32_to_f16_bits(hi);
  return a | (b << 16);
}

// O += P V. P is rounded to the input dtype here, as FlashAttention-2 does, because mma.sync
// takes 16-bit operands: the row sum l above is of the unrounded P, so out carries one extra
// relative error of the dtype's unit roundoff per term (measured against FP64 by
// tests/gpu/test_cuda_attention.cpp). The score accumulators are already where P's A
// fragment wants them (attention_layout.h: p_score_tile), so P never leaves the registers.
template <int kD, bool kBf16>
__device__ __forceinline__ void tile_pv(float (&o)[kD / 8][4], const float (&s)[kKeyTilesN][4], const uint16_t* v_s,
                                        int lane, int ld) {
#pragma unroll
  for (int kt2 = 0; kt2 < kBc / gemm::kMmaK; ++kt2) {
    uint32_t a[4];
#pragma unroll
    for (int ar = 0; ar < 4; ++ar)
      a[ar] = pack_pair<kBf16>(s[p_score_tile(kt2, ar)][p_score_reg(ar, 0)], s[p_score_tile(kt2, ar)][p_score_reg(ar, 1)]);
#pragma unroll
    for (int pair = 0; pair < kD / 16; ++pair) {
      if (kD == 64 && pair * 16 >= ld) break;  // the d padding (as in tile_scores): O there stays 0, unstored
      uint32_t r[4];
      ldmatrix_x4<true>(r, smem_addr(v_s + v_ldsm_offset(lane, pair, kt2 * gemm::kMmaK, kD)));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816<kBf16>(o[2 * pair], a, b0);
      mma_16816<kBf16>(o[2 * pair + 1], a, b1);
    }
  }
}

// out = O / l rounded once into the dtype; lse = (m + log2 l) ln 2, or 0 and -inf for a row
// that saw no key.
template <int kD, bool kBf16>
__device__ __forceinline__ void store_rows(void* out_base, float* lse, int64_t tq, int d, const float (&o)[kD / 8][4],
                                           const float (&m)[2], float (&l)[2], int64_t item, int64_t q_row0,
                                           int lane) {
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
  uint16_t* out = static_cast<uint16_t*>(out_base);
#pragma unroll
  for (int x = 0; x < kD / 8; ++x)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const gemm::Coord e = gemm::mma_c_element(lane, r);
      const int64_t row = q_row0 + e.row;
      const int col = x * gemm::kMmaN + e.col;
      const float val = o[x][r] * inv[r / 2];
      if (row < tq && col < d)
        out[(item * tq + row) * d + col] = kBf16 ? f32_to_bf16_bits(val) : f32_to_f16_bits(val);
    }
  if (lane % 4 == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = q_row0 + lane / 4 + 8 * h;
      if (row < tq) lse[item * tq + row] = l[h] > 0.0f ? (m[h] + log2f(l[h])) * kLn2 : -INFINITY;
    }
}

// 128 threads, at least one block per SM: with no minimum, ptxas aimed kD = 128 at 168
// registers (3 blocks per SM) and spilled; given the room it takes ~200, no spill
// (tests/kernels/check_ptxas.sh holds every attention kernel to that).
template <int kD, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1) attention_forward_tc_kernel(const FwdParams p) {
  BELAY_SHARED_DYNAMIC(uint16_t, smem, 128);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = blockIdx.x / p.q_tiles, q0 = static_cast<int64_t>(blockIdx.x % p.q_tiles) * kBr;
  const uint16_t* gq = static_cast<const uint16_t*>(p.q) + item * p.tq * p.ld;
  const uint16_t* gk = static_cast<const uint16_t*>(p.k) + item * p.tk * p.ld;
  const uint16_t* gv = static_cast<const uint16_t*>(p.v) + item * p.tk * p.ld;
  uint16_t* const q_s = smem;
  auto k_s = [&](int stage) { return smem + (1 + stage) * tile_elems(kD); };
  auto v_s = [&](int stage) { return smem + (3 + stage) * tile_elems(kD); };
  const int n_tiles = key_tiles(p.causal, q0, kBr, p.tq, p.tk, kBc);

  // Group 0: Q and the first K / V tile.
  load_tile<kD>(q_s, gq, q0, p.tq, p.ld);
  if (n_tiles > 0) {
    load_tile<kD>(k_s(0), gk, 0, p.tk, p.ld);
    load_tile<kD>(v_s(0), gv, 0, p.tk, p.ld);
  }
  cp_async_commit();

  float o[kD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int x = 0; x < kD / 8; ++x)
#pragma unroll
    for (int r = 0; r < 4; ++r) o[x][r] = 0.0f;
  const int64_t q_row0 = q0 + warp * gemm::kMmaM;

  for (int kt = 0; kt < n_tiles; ++kt) {
    // Prefetch tile kt + 1 into the other stage (one group per tile, empty past the end),
    // then wait for tile kt only: its copies land while the next ones are in flight.
    if (kt + 1 < n_tiles) {
      load_tile<kD>(k_s((kt + 1) % 2), gk, (kt + 1) * int64_t{kBc}, p.tk, p.ld);
      load_tile<kD>(v_s((kt + 1) % 2), gv, (kt + 1) * int64_t{kBc}, p.tk, p.ld);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // tile kt (and Q) visible to every warp

    float s[kKeyTilesN][4];
    tile_scores<kD, kBf16>(s, q_s, k_s(kt % 2), warp, lane, p.ld);
    online_softmax<kD>(s, o, m, l, p.causal, p.tq, p.tk, p.scale_log2, q_row0, kt * int64_t{kBc}, lane);
    tile_pv<kD, kBf16>(o, s, v_s(kt % 2), lane, p.ld);
    __syncthreads();  // every warp done with stage kt % 2 before tile kt + 2 is copied into it
  }
  cp_async_wait<0>();  // no copy left in flight (the empty tail group, or Q alone)
  store_rows<kD, kBf16>(p.out, p.lse, p.tq, p.d, o, m, l, item, q_row0, lane);
}

// ---- The SIMT kernels: FP32 forward, and the backward -----------------------------------
// A thread owns kD / 4 columns of its row (attention_layout.h: simt_col); a row's dot product
// is its 4 threads' parts added by an XOR tree, which gives all 4 the same bits.
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int kD>
__device__ __forceinline__ float row_dot(const float (&a)[kD / kLanesPerRow], const float* row, int sub) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kD / kLanesPerRow; ++c) acc += a[c] * row[simt_col(sub, c)];
  return row_sum(acc);
}

// Row `r` of one item's [rows][d] matrix (any dtype), the thread's columns, zero past d or rows.
template <int kD>
__device__ __forceinline__ void load_row(float (&dst)[kD / kLanesPerRow], const void* base, DType dtype, int64_t r,
                                         int64_t rows, int d, int sub) {
#pragma unroll
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
#pragma unroll
  for (int c = 0; c < kCols; ++c) o[c] = 0.0f;

  const int n_tiles = key_tiles(p.causal, q0, kSimtRows, p.tq, p.tk, kSimtCols);
  for (int kt = 0; kt < n_tiles; ++kt) {
    const int64_t j0 = kt * int64_t{kSimtCols};
    __syncthreads();  // every thread done with the previous tile
    load_simt_tile<kD>(k_s, gk, DType::F32, j0, p.tk, p.d);
    load_simt_tile<kD>(v_s, gv, DType::F32, j0, p.tk, p.d);
    __syncthreads();
    float s[kSimtCols], mx = m;
#pragma unroll
    for (int jj = 0; jj < kSimtCols; ++jj) {
      const float dot = row_dot<kD>(q, k_s[jj], me.sub);
      s[jj] = sees(p.causal, i, j0 + jj, p.tq, p.tk) ? dot * p.scale_log2 : -INFINITY;
      mx = fmaxf(mx, s[jj]);
    }
    const float base = mx == -INFINITY ? 0.0f : mx, alpha = exp2f(m - base);
    m = mx;
    l *= alpha;
#pragma unroll
    for (int c = 0; c < kCols; ++c) o[c] *= alpha;
#pragma unroll
    for (int jj = 0; jj < kSimtCols; ++jj) {
      const float pj = exp2f(s[jj] - base);  // FP32: no rounding of P on this path
      l += pj;
#pragma unroll
      for (int c = 0; c < kCols; ++c) o[c] += pj * v_s[jj][simt_col(me.sub, c)];
    }
  }
  if (i >= p.tq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* out = static_cast<float*>(p.out) + (item * p.tq + i) * p.d;
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    if (simt_col(me.sub, c) < p.d) out[simt_col(me.sub, c)] = o[c] * inv;
  if (me.sub == 0) p.lse[item * p.tq + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  const float* dsum;  // D = rowsum(dO o O), FP32
  void* dq;
  void* dk;
  void* dv;
  DType dtype, dq_dtype, dk_dtype, dv_dtype;
  int64_t tq, tk;
  int d;
  int tiles;  // blocks per item (query tiles for dQ, key tiles for dK / dV)
  float scale, scale_log2;
  bool causal;
};

// D_i = sum_c dO_ic O_ic in FP32: a warp a row (its reads coalesced), lane l adding columns
// l, l + 32, ... in order, then a fixed XOR tree over the lanes.
__global__ void attention_dsum_kernel(const void* dout, const void* out, DType dtype, int64_t rows, int d, float* dsum) {
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32; r < rows; r += warps) {
    float acc = 0.0f;
    for (int c = lane; c < d; c += 32) acc += cuda::load_f32(dout, dtype, r * d + c) * cuda::load_f32(out, dtype, r * d + c);
#pragma unroll
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
#pragma unroll
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
#pragma unroll
      for (int c = 0; c < kCols; ++c) dq[c] += pg.ds * k_s[jj][simt_col(me.sub, c)];
    }
  }
  if (i >= p.tq) return;
#pragma unroll
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
#pragma unroll
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
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        dv[c] += pg.p * g_s[ii][simt_col(me.sub, c)];
        dk[c] += pg.ds * q_s[ii][simt_col(me.sub, c)];
      }
    }
  }
  if (j >= p.tk) return;
  const int64_t row = item * p.tk + j;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int col = simt_col(me.sub, c);
    if (col >= p.d) continue;
    cuda::store_f32(p.dk, p.dk_dtype, row * p.d + col, p.scale * dk[c]);
    cuda::store_f32(p.dv, p.dv_dtype, row * p.d + col, dv[c]);
  }
}

// ---- Launchers -------------------------------------------------------------------------

// 80 KiB of dynamic shared memory (kD = 128) needs the opt-in; set once per variant.
template <auto kernel, int kD>
void configure_tc() {
  static const bool configured = [] {
    BELAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(kD)));
    return true;
  }();
  (void)configured;
}

template <int kD, bool kBf16>
void launch_tc(const FwdParams& p, unsigned blocks) {
  constexpr auto kernel = attention_forward_tc_kernel<kD, kBf16>;
  configure_tc<kernel, kD>();
  cuda::launch<kernel>(blocks, kThreads, smem_bytes(kD), nullptr, p);
}

template <bool kBf16>
void launch_tc_dim(const FwdParams& p, unsigned blocks) {
  if (padded_head_dim(p.ld) == 64) launch_tc<64, kBf16>(p, blocks);
  else launch_tc<128, kBf16>(p, blocks);
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
  if (a.dtype == DType::BF16) launch_tc_dim<true>(p, grid);
  else if (a.dtype == DType::F16) launch_tc_dim<false>(p, grid);
  else if (simt_head_dim(a.d) == 32) cuda::launch<attention_forward_simt_kernel<32>>(grid, kSimtThreads, 0, nullptr, p);
  else if (simt_head_dim(a.d) == 64) cuda::launch<attention_forward_simt_kernel<64>>(grid, kSimtThreads, 0, nullptr, p);
  else cuda::launch<attention_forward_simt_kernel<128>>(grid, kSimtThreads, 0, nullptr, p);
}

void launch_attention_backward(const AttentionProblem& a, const void* out, const float* lse, const void* dout,
                               float* dsum, void* dq, DType dq_dtype, void* dk, DType dk_dtype, void* dv,
                               DType dv_dtype) {
  const int64_t rows = a.items * a.tq;
  if (rows > 0)
    cuda::launch<attention_dsum_kernel>(cuda::grid_for(rows * 32), cuda::kBlock, 0, nullptr, dout, out, a.dtype, rows,
                                        static_cast<int>(a.d), dsum);
  BwdParams p{a.q, a.k, a.v, dout, lse, dsum, dq, dk, dv, a.dtype, dq_dtype, dk_dtype, dv_dtype, a.tq, a.tk,
              static_cast<int>(a.d), 0, a.scale, a.scale * kLog2e, a.causal};
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
