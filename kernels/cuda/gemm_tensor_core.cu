// The tensor-core GEMM for FP16 and BF16 inputs, FP32 accumulation (mma.sync m16n8k16).
// C[M,N] = op(A)[M,K] op(B)[K,N] (+ bias[N]) (+ C if beta == 1), one kBM x kBN tile of C
// per block (by default 128 x 128 with 4 warps of 64 x 64, two blocks per SM on sm_90;
// the build options BELAY_GEMM_BM / _BN / _WARPS_N / _STAGES / _GROUP_M choose others, and
// BELAY_GEMM_HOIST (on by default) the address math done once before the k loop; gemm_layout.h holds the
// tile shape, why, every option, and every index formula, tested on the CPU).
// Per k-tile of 64:
//   1. cp.async copies the A and B tiles, 16 bytes a thread at a time, into a swizzled
//      shared-memory stage, kStages - 1 tiles ahead of the math (3 stages by default), so
//      global latency hides behind the tensor cores. Out-of-range chunks are zero-filled
//      (src-size 0): that predicate is the whole K / M / N edge handling on the load side.
//   2. ldmatrix(.trans) turns the stage into mma fragments: .trans when the operand is
//      stored with M (or N) contiguous, so all four layouts of a linear layer
//      (Y = X W^T, dX = dY W, dW = dY^T X) run without a transpose pass.
//   3. 32 mma.sync per k16 step per warp (16 with 64 x 32 warp tiles).
// The epilogue adds the bias in FP32 (and C for beta == 1) and rounds once into C's dtype,
// predicated on row < M and col < N.
// Operands whose rows are not 16-byte aligned (a stored row length that is not a multiple
// of 8) are first copied by the caller into a zero-padded buffer whose rows are a multiple
// of 8 elements (launch_pad_rows below), so one kernel, always on the cp.async path, serves
// every shape.
// Batched products run their items along gridDim.z, each block on one item's operands.
// Bytes: (M*K + K*N) * 2 * (re-reads: N/kBN for A, M/kBM for B, mostly from L2) + M*N*|C|;
// flops: 2*M*N*K.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/gemm_kernels.h"
#include "kernels/cuda/gemm_layout.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace belay {
namespace {

using namespace gemm;

using namespace ptx;

struct TcParams {
  const uint16_t* a;
  const uint16_t* b;
  void* c;
  const void* bias;
  int64_t lda, ldb;
  int64_t stride_a, stride_b;  // batch item strides (elements; 0: shared); C's is m * n
  int m, n, k;
  DType c_dtype, bias_dtype;
  bool accumulate;  // beta == 1: C is FP32 and is added
};

// Copies one operand tile (A or B, k-tile kt) into a stage. kKMajor: stored [mn][k], else
// [k][mn]; kMn is the tile's extent along M (kBM, for A) or N (kBN, for B), mn0 its first
// row of op(A) (or column of op(B)). Which chunk each thread copies, and from where, is
// tile_chunk_copy (gemm_layout.h).
template <bool kKMajor, int kMn>
__device__ __forceinline__ void load_tile(uint16_t* stage, const uint16_t* g, int64_t ld, int mn_total, int k_total,
                                          int mn0, int k0) {
  BELAY_UNROLL
  for (int pass = 0; pass < load_passes(kMn); ++pass) {
    const ChunkCopy c = tile_chunk_copy(kKMajor, kMn, threadIdx.x, pass, ld, mn_total, k_total, mn0, k0);
    // Outside the operand: 0 source bytes zero-fill the chunk (the address stays valid).
    cp_async_16(smem_addr(stage + c.dst), g + c.src, c.inside ? 16 : 0);
  }
}

// The same copies with the address math hoisted (BELAY_GEMM_HOIST): the thread's LoadPlan,
// computed once, and compile-time steps per pass (gemm_layout.h shows they give what
// tile_chunk_copy gives). `stage` is the stage's shared-memory address.
template <bool kKMajor, int kMn>
__device__ __forceinline__ void load_tile_planned(uint32_t stage, const uint16_t* g, int64_t ld, int mn_total,
                                                  int k_total, int mn0, int k0, const LoadPlan& plan) {
  constexpr int kRowStep = load_row_step(kKMajor, kMn), kDstStep = load_dst_step(kKMajor, kMn);
  const int rows_total = kKMajor ? mn_total : k_total, cols_total = kKMajor ? k_total : mn_total;
  const int row0 = (kKMajor ? mn0 : k0) + plan.row;
  const int col = (kKMajor ? k0 : mn0) + plan.chunk * kChunkElems;
  const int64_t src0 = static_cast<int64_t>(row0) * ld + col, src_step = kRowStep * ld;
  BELAY_UNROLL
  for (int pass = 0; pass < load_passes(kMn); ++pass) {
    const bool inside = row0 + pass * kRowStep < rows_total && col < cols_total;
    // Outside the operand: 0 source bytes zero-fill the chunk (the address stays valid).
    cp_async_16(stage + 2 * (plan.dst + pass * kDstStep), inside ? g + src0 + pass * src_step : g, inside ? 16 : 0);
  }
}

// One element of the epilogue, out of line: keeps the dtype switches from being copied 64
// times into the unrolled loop. Fields by value: a reference to the kernel's parameter
// struct would copy it to local memory.
__device__ __noinline__ void store_c(void* c, DType c_dtype, const void* bias, DType bias_dtype, bool accumulate,
                                     int64_t idx, int64_t col, float v) {
  if (accumulate) v = static_cast<const float*>(c)[idx] + v;
  if (bias) v += cuda::load_f32(bias, bias_dtype, col);
  cuda::store_f32(c, c_dtype, idx, v);
}

template <bool kAKMajor, bool kBKMajor, bool kBf16>
// Two blocks per SM by default (kBlocksPerSm): with 128 threads a block may use up to 255
// registers and two still fit.
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) gemm_tc_kernel(const TcParams p) {
  BELAY_SHARED_DYNAMIC(uint16_t, smem, 128);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Which tile of C: (blockIdx.y, blockIdx.x), or grouped rows with BELAY_GEMM_GROUP_M.
  const BlockTile tile = block_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y);
  const int bm = static_cast<int>(tile.bm), bn = static_cast<int>(tile.bn);
  const int m0 = bm * kBM, n0 = bn * kBN;
  const int k_tiles = static_cast<int>(ceil_div(p.k, kBK));
  // Batch item blockIdx.z: its operands, as if it were the only product.
  const uint16_t* ga = p.a + blockIdx.z * p.stride_a;
  const uint16_t* gb = p.b + blockIdx.z * p.stride_b;
  const int64_t c0 = static_cast<int64_t>(blockIdx.z) * p.m * p.n;

  auto stage_a = [&](int s) { return smem + s * kStageElems; };
  auto stage_b = [&](int s) { return smem + s * kStageElems + kATileElems; };
  // kHoist: the stages' shared-memory addresses and the thread's loader plans, once.
  const uint32_t smem_base = smem_addr(smem);
  const LoadPlan plan_a = load_plan(kAKMajor, kBM, threadIdx.x), plan_b = load_plan(kBKMajor, kBN, threadIdx.x);
  auto load_stage = [&](int kt) {
    if (kt < k_tiles) {
      const int s = kt % kStages;
      if constexpr (kHoist) {
        const uint32_t a_stage = smem_base + 2 * s * kStageElems;
        load_tile_planned<kAKMajor, kBM>(a_stage, ga, p.lda, p.m, p.k, m0, kt * kBK, plan_a);
        load_tile_planned<kBKMajor, kBN>(a_stage + 2 * kATileElems, gb, p.ldb, p.n, p.k, n0, kt * kBK, plan_b);
      } else {
        load_tile<kAKMajor, kBM>(stage_a(s), ga, p.lda, p.m, p.k, m0, kt * kBK);
        load_tile<kBKMajor, kBN>(stage_b(s), gb, p.ldb, p.n, p.k, n0, kt * kBK);
      }
    }
    cp_async_commit();  // one group per k-tile, empty past the end
  };

  float acc[kWarpTilesM][kWarpTilesN][4];
  BELAY_UNROLL
  for (int i = 0; i < kWarpTilesM; ++i)
    BELAY_UNROLL
    for (int j = 0; j < kWarpTilesN; ++j)
      BELAY_UNROLL
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;
  // kHoist: the lane's fixed ldmatrix offsets (bytes from its operand tile's start); each
  // ldmatrix then adds a compile-time step (gemm_layout.h, *_ldsm_fixed and *_ldsm_step).
  uint32_t a_fixed[kLdsmFixedA], b_fixed[kLdsmFixedB];
  BELAY_UNROLL
  for (int i = 0; i < kLdsmFixedA; ++i) a_fixed[i] = 2 * a_ldsm_fixed(kAKMajor, lane, wm, i);
  BELAY_UNROLL
  for (int i = 0; i < kLdsmFixedB; ++i) b_fixed[i] = 2 * b_ldsm_fixed(kBKMajor, lane, wn, i);

  // Prologue: kStages - 1 tiles in flight before the first mma.
  BELAY_UNROLL
  for (int s = 0; s < kStages - 1; ++s) load_stage(s);

  for (int kt = 0; kt < k_tiles; ++kt) {
    // Tile kt has landed once at most kStages - 2 younger groups are pending; the barrier
    // makes it visible to every warp and also says every warp is done with tile kt - 1,
    // whose stage the next prefetch overwrites.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    load_stage(kt + kStages - 1);

    const uint16_t* a_s = stage_a(kt % kStages);
    const uint16_t* b_s = stage_b(kt % kStages);
    const uint32_t a_addr = smem_base + 2 * (kt % kStages) * kStageElems, b_addr = a_addr + 2 * kATileElems;
    BELAY_UNROLL
    for (int kk = 0; kk < kBK; kk += kMmaK) {
      uint32_t af[kWarpTilesM][4];
      uint32_t bf[kWarpTilesN][2];
      BELAY_UNROLL
      for (int mi = 0; mi < kWarpTilesM; ++mi)
        ldmatrix_x4<!kAKMajor>(af[mi], kHoist ? a_addr + a_fixed[a_ldsm_index(kAKMajor, mi, kk)] +
                                                    2 * a_ldsm_step(kAKMajor, mi, kk)
                                              : smem_addr(a_s + a_ldsm_offset(kAKMajor, lane, wm, mi, kk)));
      BELAY_UNROLL
      for (int pair = 0; pair < kWarpTilesN / 2; ++pair) {
        uint32_t r[4];
        ldmatrix_x4<!kBKMajor>(r, kHoist ? b_addr + b_fixed[b_ldsm_index(kBKMajor, pair, kk)] +
                                               2 * b_ldsm_step(kBKMajor, pair, kk)
                                         : smem_addr(b_s + b_ldsm_offset(kBKMajor, lane, wn, pair, kk)));
        bf[2 * pair][0] = r[0];
        bf[2 * pair][1] = r[1];
        bf[2 * pair + 1][0] = r[2];
        bf[2 * pair + 1][1] = r[3];
      }
      BELAY_UNROLL
      for (int mi = 0; mi < kWarpTilesM; ++mi)
        BELAY_UNROLL
        for (int ni = 0; ni < kWarpTilesN; ++ni) mma_16816<kBf16>(acc[mi][ni], af[mi], bf[ni]);
    }
  }
  cp_async_wait<0>();  // leave no copy in flight (the empty tail groups)

  // Epilogue: bias and C added in FP32, one rounding into C's dtype. Fully unrolled with no
  // early exit, so the accumulators stay in registers (a loop the compiler does not unroll
  // indexes acc at run time and moves all 64 of them to local memory).
  BELAY_UNROLL
  for (int mi = 0; mi < kWarpTilesM; ++mi)
    BELAY_UNROLL
    for (int ni = 0; ni < kWarpTilesN; ++ni)
      BELAY_UNROLL
      for (int r = 0; r < 4; ++r) {
        const Coord64 e = c_element(bm, bn, warp, mi, ni, lane, r);
        const float v = acc[mi][ni][r];
        if (e.row < p.m && e.col < p.n)
          store_c(p.c, p.c_dtype, p.bias, p.bias_dtype, p.accumulate, c0 + e.row * p.n + e.col, e.col, v);
      }
}

// kSmemBytes (96 KiB by default) of dynamic shared memory needs the opt-in (the default
// ceiling is 48 KiB), and two blocks per SM (or one of up to 192 KiB) want the largest
// shared-memory carveout (the kernel's copies bypass L1 anyway); set once per variant (host-side attributes, no device synchronisation). The
// kernel is a template argument so that each variant has its own `configured` flag: with
// the kernel's type as the parameter, all eight variants (one type) shared one flag and
// only the first launched was ever configured.
template <auto kernel>
void configure_variant() {
  static const bool configured = [] {
    BELAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    BELAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
    return true;
  }();
  (void)configured;
}

template <bool kAKMajor, bool kBKMajor, bool kBf16>
void launch_variant(const TcParams& p, int64_t batch) {
  configure_variant<gemm_tc_kernel<kAKMajor, kBKMajor, kBf16>>();
  const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kBN)), static_cast<unsigned>(ceil_div(p.m, kBM)),
                  static_cast<unsigned>(batch));
  cuda::launch<gemm_tc_kernel<kAKMajor, kBKMajor, kBf16>>(grid, kThreads, kSmemBytes, nullptr, p);
}

template <bool kBf16>
void launch_layouts(const TcParams& p, int64_t batch, bool a_kmajor, bool b_kmajor) {
  if (a_kmajor && b_kmajor) launch_variant<true, true, kBf16>(p, batch);
  else if (a_kmajor) launch_variant<true, false, kBf16>(p, batch);
  else if (b_kmajor) launch_variant<false, true, kBf16>(p, batch);
  else launch_variant<false, false, kBf16>(p, batch);
}

// dst[r][c] = c < cols ? src[r][c] : 0 for c < ld_dst: 16-bit elements, any alignment.
__global__ void pad_rows_kernel(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst) {
  const int64_t n = rows * ld_dst;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / ld_dst, c = i % ld_dst;
    dst[i] = c < cols ? src[r * cols + c] : uint16_t(0);
  }
}

}  // namespace

bool rows_aligned(const void* base, int64_t ld) {
  return ld % kChunkElems == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

void launch_pad_rows(const void* src, int64_t rows, int64_t cols, void* dst) {
  const int64_t n = rows * padded_ld(cols);
  if (n > 0)
    cuda::launch<pad_rows_kernel>(cuda::grid_for(n), cuda::kBlock, 0, nullptr, static_cast<const uint16_t*>(src), rows, cols,
                                                         static_cast<uint16_t*>(dst), padded_ld(cols));
}

int gemm_tensor_core_blocks_per_sm() {
  constexpr auto kernel = gemm_tc_kernel<true, true, false>;
  configure_variant<kernel>();
  int blocks = 0;
  BELAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, kSmemBytes));
  return blocks;
}

void launch_gemm_tensor_core(const GemmProblem& g) {
  TcParams p;
  p.a = static_cast<const uint16_t*>(g.a);
  p.b = static_cast<const uint16_t*>(g.b);
  p.c = g.c;
  p.bias = g.bias;
  p.lda = g.lda;
  p.ldb = g.ldb;
  p.stride_a = g.stride_a;
  p.stride_b = g.stride_b;
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.c_dtype = g.c_dtype;
  p.bias_dtype = g.bias_dtype;
  p.accumulate = g.beta == 1.0f;
  // A not transposed is stored [M][K]: K-major. B transposed is stored [N][K]: K-major.
  const bool a_kmajor = !g.trans_a, b_kmajor = g.trans_b;
  if (g.ab_dtype == DType::BF16)
    launch_layouts<true>(p, g.batch, a_kmajor, b_kmajor);
  else
    launch_layouts<false>(p, g.batch, a_kmajor, b_kmajor);
}

}  // namespace belay
