// The fused attention's forward in FP16 / BF16 on tensor cores (attention_kernels.cu has the
// overview and the FP32 forward): a block per (item, 64 queries), a warp per 16 of them. The
// block's Q tile and a double-buffered pair of K / V tiles (64 keys) go through cp.async into
// swizzled shared memory; S = Q K^T and O += P V run on mma.sync m16n8k16 fed by ldmatrix,
// FP32 accumulators; the online softmax (running max and sum per row, FP32, in log2 units:
// scale * log2 e is folded into the scores) rescales O as keys stream by. Causal key tiles past
// the block's last query are never loaded. O is rounded once into out's dtype, lse in FP32.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace belay {
namespace {

using namespace attn;
using namespace ptx;

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
  BELAY_UNROLL
  for (int ni = 0; ni < kKeyTilesN; ++ni)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) {
      const ScorePos e = score_pos(lane, ni, r);
      const bool live = sees(causal, q_row0 + e.row, j0 + e.key, tq, tk);
      s[ni][r] = live ? s[ni][r] * scale_log2 : -INFINITY;
      mx[r / 2] = fmaxf(mx[r / 2], s[ni][r]);
    }
  float base[2], alpha[2];
  BELAY_UNROLL
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    base[h] = mx[h] == -INFINITY ? 0.0f : mx[h];  // a row that has seen no key yet: no inf - inf
    alpha[h] = exp2f(m[h] - base[h]);
    m[h] = mx[h];
  }
  float sum[2] = {0.0f, 0.0f};
  BELAY_UNROLL
  for (int ni = 0; ni < kKeyTilesN; ++ni)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) {
      s[ni][r] = exp2f(s[ni][r] - base[r / 2]);
      sum[r / 2] += s[ni][r];
    }
  BELAY_UNROLL
  for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
  BELAY_UNROLL
  for (int x = 0; x < kD / 8; ++x)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) o[x][r] *= alpha[r / 2];
}

// out = O / l rounded once into the dtype; lse = (m + log2 l) ln 2, or 0 and -inf for a row
// that saw no key.
template <int kD, bool kBf16>
__device__ __forceinline__ void store_rows(void* out_base, float* lse, int64_t tq, int d, const float (&o)[kD / 8][4],
                                           const float (&m)[2], float (&l)[2], int64_t item, int64_t q_row0,
                                           int lane) {
  float inv[2];
  BELAY_UNROLL
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
  uint16_t* out = static_cast<uint16_t*>(out_base);
  BELAY_UNROLL
  for (int x = 0; x < kD / 8; ++x)
    BELAY_UNROLL
    for (int r = 0; r < 4; ++r) {
      const gemm::Coord e = gemm::mma_c_element(lane, r);
      const int64_t row = q_row0 + e.row;
      const int col = x * gemm::kMmaN + e.col;
      const float val = o[x][r] * inv[r / 2];
      if (row < tq && col < d)
        out[(item * tq + row) * d + col] = kBf16 ? f32_to_bf16_bits(val) : f32_to_f16_bits(val);
    }
  if (lane % 4 == 0)
    BELAY_UNROLL
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
  BELAY_UNROLL
  for (int x = 0; x < kD / 8; ++x)
    BELAY_UNROLL
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

template <int kD, bool kBf16>
void launch_tc(const FwdParams& p, unsigned blocks) {
  constexpr auto kernel = attention_forward_tc_kernel<kD, kBf16>;
  configure_smem<kernel>(smem_bytes(kD));  // 80 KiB at kD = 128
  cuda::launch<kernel>(blocks, kThreads, smem_bytes(kD), nullptr, p);
}

template <bool kBf16>
void launch_tc_dim(const FwdParams& p, unsigned blocks) {
  if (padded_head_dim(p.ld) == 64) launch_tc<64, kBf16>(p, blocks);
  else launch_tc<128, kBf16>(p, blocks);
}

}  // namespace

void attn::launch_forward_tc(const FwdParams& p, unsigned blocks, bool bf16) {
  if (bf16) launch_tc_dim<true>(p, blocks);
  else launch_tc_dim<false>(p, blocks);
}

}  // namespace belay
