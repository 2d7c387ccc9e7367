// The BF16 x BF16 product on AMX tiles, C (+)= op(A) op(B) (+ bias) with FP32 C: the amx
// path's GEMM for two BF16 inputs (every other product on that path is avx512bf16's,
// kernels/cpu/cpu_gemm.cpp). Built twice from this one source (kernels/cpu/isa/isa.cmake):
//   - isa_amx: the real instructions (-mamx-tile -mamx-bf16, on top of the avx512bf16 flags);
//   - isa_amx_emulated: kernels/cpu/isa/amx_tiles.h's emulator, baseline x86-64 flags, so
//     this file's logic runs (and is tested) on every CPU.
// Nothing here needs more than SSE2 besides the tile operations.
//
// A tile is 16 rows x 64 bytes: 16 x 16 FP32 of C, or 16 rows x 16 BF16 pairs of A or B.
// TDPBF16PS C, A, B adds, to each C[m][n], the 16 pair products of A's row m and B's
// column n, where B's row p holds pair p (k = 2p, 2p + 1) of 16 columns side by side (the
// "VNNI" layout). So:
//   - A: rows of op(A) along k, packed in tile order (amx_blocks.h, tiled_a_index): each tile
//     (16 rows x 32 k) one 1 KiB run, loaded with a 64-byte row stride;
//   - B: panels 32 columns wide, pair p of the 32 columns at [p][32] (the pair layout of the
//     avx512bf16 path's VDPBF16PS panels); a tile is 16 pairs x 16 columns of a panel;
//   - the microkernel holds a 32 x 32 block of C in four tiles (0-3) and walks k 32 at a
//     time: two A tiles (4, 5), two B tiles (6, 7), four TDPBF16PS.
// Edges: packed rows past M, columns past N and k past K are zeros (in both operands, so no
// NaN can come from padding), and a C block past the edge goes through a local 32 x 32.
// The microkernel, the B panels' packing and the 8 x 8 transpose are amx_blocks.h's (the fused
// attention's AMX products use them too).
//
// Summation order, for each output: C starts at 0 (or the old C when accumulating), then
// its pairs are added in k order, pair by pair (amx_tiles.h: even product, then odd), the tile
// carried through C between K blocks (an exact FP32 store and load, so the block sizes do not
// change the bits); the bias is added after the last block. Threads split the longer of M and N in
// whole 32-wide blocks, so the result does not depend on the thread count.
//
// Speed: on an AMX Xeon (2026-12-04, one thread) the Linear(4096) products at batch 256 ran at
// 462-562 GFLOP/s, 3.6-4.3x the avx512 FP32 GEMM, 0.15-0.18 of the TDPBF16PS loop's peak
// (bench/results/cpu-2026-12-04-xeon-amx.md). Blocking: K in as few equal blocks of at most 1024
// as it takes (kn_blocks),
// a block of A (kMC rows) and one of B (1.5 MB of pair panels) in L2; each B panel serves the
// kMC / 32 row blocks of A in turn (from L1 while it fits: 64 x depth bytes). 2026-12-06:
// bench/results/cpu-2026-12-06-xeon-amx-blocks.md (what the blocks and the BF16 C changed, and
// what was tried and not kept).
// 2026-12-06 (evening): A in tile order instead of rows a depth apart (same bits), 1.00-1.11x the
// speed on GPT-2 small's bf16 products at 1024 tokens, median about 1.04 (1 thread, the two
// builds alternated product by product:
// bench/results/cpu-2026-12-06-xeon-amx-tiled-a.md). Tried and not kept: K walked in chunks of 256
// inside each B panel, the chunk serving the 4 row blocks of A from L1 with their sums carried
// in L1: 1.2x on a hot 128 x 768 block alone, 0.95-1.0x inside the product (a quarter of its
// time is packing and rounding, not tiles).
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/gemm_amx.cpp is built once per copy by isa.cmake"
#endif
#define BELAY_HD static inline  // engine/half_bits.h: this copy's own rounding (the one-definition rule)
#include <emmintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/half_bits.h"
#include "kernels/cpu/isa/amx_blocks.h"
#include "kernels/cpu/isa/gemm_f32.h"
#include "kernels/cpu/isa/gemm_slices.h"

namespace belay::BELAY_ISA_NS {
namespace {

constexpr int kOneBlockK = static_cast<int>(kAmxOneBlockK);  // the deepest K block (K up to it: one block)
constexpr int kMC = 128;          // rows of A per block
constexpr int64_t kBBlockBytes = 1536 * 1024;  // a B block: three quarters of a Sapphire Rapids L2
static_assert(kOneBlockK % kTileK == 0 && kMC % kBlock == 0, "blocks are whole tiles");

// The K and N blocks of a product of depth k_total: as few K blocks as kOneBlockK allows, of
// equal depth (whole tiles), since each block past the first loads C's tiles back and stores
// them again. Against blocks of 512 (2026-12-06, the AMX Xeon, alternated): GPT-2 small's K =
// 768 and 1024 products (one block now) took 0.83-0.95 of the time, the tied head's forward
// 0.83 (its C 1024 x 50304 FP32 read and written from memory), and K = 2304, 3072 and 50304
// (blocks of 768, 1024 and 1024) 0.90-0.92. The B block's columns then fill its bytes.
struct KnBlocks {
  int kc;      // k per K block (the last may be shorter)
  int64_t nc;  // columns per N block, whole panels
};
KnBlocks kn_blocks(int64_t k_total) {
  const int64_t blocks = (k_total + kOneBlockK - 1) / kOneBlockK;
  const int kc = static_cast<int>(round_up((k_total + blocks - 1) / blocks, kTileK));
  return {kc, kBBlockBytes / (static_cast<int64_t>(kc) / 2 * 4) / kBlock * kBlock};  // kc / 2 pairs x nc words
}

// Rows [r0, r0 + rows) x k [k0, k0 + kc) of op(A) whose rows are runs along k into dst in
// tile order (amx_blocks.h: tiled_a_index, depth = kc rounded up to whole tiles), one tile row
// (32 k, 64 bytes) at a time; rows up to a whole 32-row block and k past kc are zero.
void pack_a_rows(const View& v, int64_t r0, int rows, int64_t k0, int kc, int depth, uint16_t* dst) {
  const int padded_rows = static_cast<int>(round_up(rows, kBlock)), whole = kc / kTileK * kTileK;
  for (int r = 0; r < padded_rows; ++r) {
    int k = 0;
    if (r < rows) {
      const uint16_t* src = v.data + v.at(r0 + r, k0);
      for (; k < whole; k += kTileK) memcpy(dst + tiled_a_index(r, k, depth), src + k, kTileK * 2);
      if (k < kc) {  // the last tile row: kc - k values, zeros after
        uint16_t* d = dst + tiled_a_index(r, k, depth);
        memcpy(d, src + k, static_cast<size_t>(kc - k) * 2);
        memset(d + (kc - k), 0, static_cast<size_t>(kTileK - (kc - k)) * 2);
        k += kTileK;
      }
    }
    for (; k < depth; k += kTileK) memset(dst + tiled_a_index(r, k, depth), 0, kTileK * 2);
  }
}

// The same for an op(A) whose k are runs along the rows (dW's dY^T): 8 x 8 transposes, each
// inside one tile (8 rows of a 32-row block, 8 k of a 32-k step: destination rows kTileK
// apart), then the edges and the zeros.
void pack_a_columns(const View& v, int64_t r0, int rows, int64_t k0, int kc, int depth, uint16_t* dst) {
  auto at = [&](int r, int k) { return dst + tiled_a_index(r, k, depth); };
  const int r8 = rows / 8 * 8, k8 = kc / 8 * 8;
  for (int r = 0; r < r8; r += 8) {
    for (int k = 0; k < k8; k += 8) transpose_8x8_u16(v.data + v.at(r0 + r, k0 + k), v.ld, at(r, k), kTileK);
    for (int q = 0; q < 8; ++q)
      for (int k = k8; k < kc; ++k) *at(r + q, k) = v.data[v.at(r0 + r + q, k0 + k)];
  }
  for (int r = r8; r < rows; ++r)
    for (int k = 0; k < kc; ++k) *at(r, k) = v.data[v.at(r0 + r, k0 + k)];
  const int padded_rows = static_cast<int>(round_up(rows, kBlock));
  for (int r = 0; r < padded_rows; ++r)
    for (int k = r < rows ? kc : 0; k < depth; ++k) *at(r, k) = 0;
}

void pack_a(const View& v, int64_t r0, int rows, int64_t k0, int kc, int depth, uint16_t* dst) {
  if (v.r_contiguous)
    pack_a_columns(v, r0, rows, k0, kc, depth, dst);
  else
    pack_a_rows(v, r0, rows, k0, kc, depth, dst);
}

// Per-thread packing buffers, kept between calls (grown never; sized for whole blocks).
struct Buffers {
  uint16_t* a = nullptr;  // kMC x kOneBlockK BF16
  uint32_t* b = nullptr;  // kBBlockBytes of pair words
};
thread_local Buffers tls_buffers;

void* aligned_bytes(size_t n) {
  void* p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) abort();  // the product cannot run without them; about 1 MB per thread
  return p;
}

Buffers& buffers() {
  Buffers& b = tls_buffers;
  if (!b.a) {
    b.a = static_cast<uint16_t*>(aligned_bytes(static_cast<size_t>(kMC) * kOneBlockK * 2));
    b.b = static_cast<uint32_t*>(aligned_bytes(static_cast<size_t>(kBBlockBytes)));
  }
  return b;
}

// One row of a BF16 C block: src (+ bias) rounded once, `cols` outputs.
void round_row(const float* src, const float* bias, uint16_t* dst, int cols) {
  if (bias)
    for (int j = 0; j < cols; ++j) dst[j] = f32_to_bf16_bits_select(src[j] + bias[j]);
  else
    for (int j = 0; j < cols; ++j) dst[j] = f32_to_bf16_bits_select(src[j]);
}

// The 32 x 32 block of C at (row, col), `rows` x `cols` of it inside C: the microkernel over a
// packed block of A rows (tile order) and a B panel, straight into an FP32 C where the block is
// whole, else into `local` and from there into C: copied (FP32), or (BF16: one K block, nothing
// accumulated) the bias added and each output rounded once.
void c_block(const GemmF32Args& g, int64_t n_total, int64_t row, int64_t col, int rows, int cols, int depth,
             const uint16_t* a, const uint32_t* b, bool overwrite, float* local) {
  if (g.c_bf16) {
    microkernel_on(depth, TiledA{a}, b, local, kBlock, true);
    for (int i = 0; i < rows; ++i)
      round_row(local + i * kBlock, g.bias ? g.bias + col : nullptr, g.c_bf16 + (row + i) * n_total + col, cols);
    return;
  }
  float* c = g.c + row * n_total + col;
  if (rows == kBlock && cols == kBlock) {
    microkernel_on(depth, TiledA{a}, b, c, n_total, overwrite);
    return;
  }
  if (!overwrite)
    for (int i = 0; i < kBlock; ++i)
      for (int j = 0; j < kBlock; ++j) local[i * kBlock + j] = i < rows && j < cols ? c[i * n_total + j] : 0.0f;
  microkernel_on(depth, TiledA{a}, b, local, kBlock, overwrite);
  for (int i = 0; i < rows; ++i) memcpy(c + i * n_total, local + i * kBlock, static_cast<size_t>(cols) * 4);
}

// The rows [m0, m1) x columns [n0, n1) of C, on the calling thread.
void gemm_slice(const GemmF32Args& g, const View& av, const View& bv, int64_t k_total, int64_t n_total, int64_t m0,
                int64_t m1, int64_t n0, int64_t n1) {
  Buffers& buf = buffers();
  alignas(64) float local[kBlock * kBlock];  // a C block that crosses the edge of C, or a BF16 C's
  const KnBlocks blocks = kn_blocks(k_total);
  for (int64_t jc = n0; jc < n1; jc += blocks.nc) {
    const int64_t nc = min64(blocks.nc, n1 - jc);
    for (int64_t pc = 0; pc < k_total; pc += blocks.kc) {
      const int kc = static_cast<int>(min64(blocks.kc, k_total - pc));
      const int depth = static_cast<int>(round_up(kc, kTileK));
      const bool overwrite = pc == 0 && !g.accumulate;
      for (int64_t jr = 0; jr < nc; jr += kBlock)
        pack_b_panel(bv, jc + jr, static_cast<int>(min64(kBlock, nc - jr)), pc, kc, depth,
                     buf.b + jr / 2 * depth);
      for (int64_t ic = m0; ic < m1; ic += kMC) {
        const int64_t mc = min64(kMC, m1 - ic);
        pack_a(av, ic, static_cast<int>(mc), pc, kc, depth, buf.a);
        for (int64_t jr = 0; jr < nc; jr += kBlock)
          for (int64_t ir = 0; ir < mc; ir += kBlock)
            c_block(g, n_total, ic + ir, jc + jr, static_cast<int>(min64(kBlock, mc - ir)),
                    static_cast<int>(min64(kBlock, nc - jr)), depth, buf.a + tiled_a_index(ir, 0, depth),
                    buf.b + jr / 2 * depth, overwrite, local);
      }
    }
  }
  if (g.bias && !g.c_bf16)  // a BF16 C has it already, added before the rounding
    for (int64_t i = m0; i < m1; ++i)
      for (int64_t j = n0; j < n1; ++j) g.c[i * n_total + j] += g.bias[j];
}

}  // namespace

// Both inputs BF16 (the caller, kernels/cpu/cpu_gemm.cpp, sends nothing else).
void gemm_amx(const GemmF32Args& g) {
  const GemmShape shape = gemm_shape(g);
  if (gemm_done_without_sums(g, shape)) return;
  const View av{static_cast<const uint16_t*>(g.a), g.a_cols, g.trans_a};   // op(A) as M x K
  const View bv{static_cast<const uint16_t*>(g.b), g.b_cols, !g.trans_b};  // op(B) as N x K
  const ThreadSlices slices = thread_slices(shape, kBlock, kBlock);  // in whole 32 x 32 blocks
  const amx::TileConfig cfg = tile_config();
#pragma omp parallel for num_threads(static_cast<int>(slices.threads)) schedule(static, 1) if (slices.threads > 1)
  for (int64_t t = 0; t < slices.threads; ++t) {
    int64_t m0, m1, n0, n1;
    if (!slices.slice(t, m0, m1, n0, n1)) continue;
    amx::load_config(cfg);  // tile state is per thread
    gemm_slice(g, av, bv, shape.k, shape.n, m0, m1, n0, n1);
    amx::release();
  }
}

#if defined(BELAY_AMX_EMULATED)
int amx_faults() { return amx::faults(); }
const char* amx_first_fault() { return amx::first_fault(); }
void amx_reset_faults() { amx::reset_faults(); }
#endif

}  // namespace belay::BELAY_ISA_NS
