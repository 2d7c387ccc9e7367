// The index math of the tensor-core GEMM, kept apart from the kernel so that a plain C++
// compiler can check it without a GPU (tests/kernels/test_cuda_index_math.cpp): tile sizes,
// the shared-memory swizzle, which chunk each thread copies, which address each lane gives
// ldmatrix, which element of an mma.sync m16n8k16 fragment each (lane, register) holds, and
// how tiles cover odd shapes. The kernel calls these very functions, and
// tests/kernels/test_cuda_gemm_emulation.cpp runs a whole block through them on the CPU.
// No CUDA header is included here: BELAY_HD comes from engine/half_bits.h.
#pragma once
#include <cstdint>

#include "engine/half_bits.h"

namespace belay::gemm {

// ---- Tile shape -----------------------------------------------------------------------
// Default: a block computes a 128 x 128 tile of C with 4 warps in a 2 (M) x 2 (N) grid, so a
// warp owns 64 x 64: 4 m16 tiles times 8 n8 tiles = 32 mma per k16 step, 128 FP32
// accumulators per thread (226-255 registers, no spill). Why 64 x 64 and not 64 x 32 with 8
// warps: per mma a warp then reads 128 bytes of shared memory through ldmatrix instead of
// 192, and at 128 bytes per clock per SM, 192 would let shared memory, not the tensor cores,
// set the pace of mma.sync on Hopper (measured on an H200: the 64 x 32 grid ran at 0.32-0.35
// of cuBLAS, the 64 x 64 one at 0.36-0.40, bench/results/gpu-2026-12-04-h200); two such
// blocks fit an SM (registers: 2 x 128 x 256; shared memory: 2 x 96 KiB, on sm_90), so one
// block's barrier does not idle the tensor cores.
//
// Build options (CMake cache variables of the same names; bench/gpu-check.sh builds and
// measures the variants side by side, tests/CMakeLists.txt runs this index math for each):
//   BELAY_GEMM_BM, BELAY_GEMM_BN (128 or 256): the block tile. A warp tile is always 64 rows
//     high, so BM / 64 warps run along M. 128 x 256 or 256 x 128 with 8 warps of 64 x 64
//     (256 threads, one block per SM) is the largest tile the register file allows (8 x 32
//     lanes x 255 registers); it reads 48 KiB from L2 per k-tile for 4.2 MFLOP where
//     128 x 128 reads 32 KiB for 2.1 MFLOP: a third less L2 traffic per flop. At 8192^3 the
//     128 x 128 tile streams ~16 GiB from L2 into the SMs, ~4.9 TB/s at the measured 318
//     TFLOP/s, near what an H100-class L2 delivers. Yet on an H200 128 x 256 with 4 stages
//     gained only 4% (bench/results/gpu-2026-12-04-h200-gemm-variants), and lost at 1024^3
//     (32 blocks for 132 SMs): the default's ceiling is inside the SM, not in L2.
//   BELAY_GEMM_WARPS_N: warps along N (default BN / 64: 64-wide warp tiles); BN / WARPS_N
//     must be 64 or 32 (BELAY_GEMM_WARPS_N=4 with BN 128: 8 warps of 64 x 32).
//   BELAY_GEMM_STAGES (2..4): the cp.async pipeline depth. Hopper's longer memory latency
//     wants more bytes in flight; each stage costs (BM + BN) x 64 x 2 bytes of shared
//     memory, which sets how many blocks fit an SM (227 KiB a block, 228 an SM on sm_90;
//     164 KiB a block on sm_80, so the 192 KiB variants are for sm_90 only).
//   BELAY_GEMM_HOIST (1 = on, the default since it measured 7-21% faster on an H200): the address math that does not change from k-tile to k-tile
//     is done once before the k loop (load_plan and the *_ldsm_fixed / *_ldsm_step split
//     below): the PTX of the default k loop holds ~480 integer and select instructions
//     beside its 128 mma.sync and 32 ldmatrix, which compete with the mma for issue slots.
//   BELAY_GEMM_GROUP_M (1 = off): blocks launched one after another walk GROUP_M tile rows
//     down before moving right (block_tile below), so a wave of resident blocks shares
//     A's and B's tiles in L2 instead of sweeping all of B per row of tiles.
// None of these changes a result's bits: each C element is still one thread's FP32
// accumulator summed over k in the same order (k-tile by k-tile, k16 step by k16 step).
// BK = 64 halves makes a K-major smem row exactly 128 bytes (8 chunks of 16 B), the width
// over which the XOR swizzle below spreads 8 rows across all 32 banks.
#ifndef BELAY_GEMM_BM
#define BELAY_GEMM_BM 128
#endif
#ifndef BELAY_GEMM_BN
#define BELAY_GEMM_BN 128
#endif
#ifndef BELAY_GEMM_WARPS_N
#define BELAY_GEMM_WARPS_N (BELAY_GEMM_BN / 64)
#endif
#ifndef BELAY_GEMM_STAGES
#define BELAY_GEMM_STAGES 3
#endif
#ifndef BELAY_GEMM_GROUP_M
#define BELAY_GEMM_GROUP_M 1
#endif
#ifndef BELAY_GEMM_HOIST
#define BELAY_GEMM_HOIST 1
#endif
constexpr int kBM = BELAY_GEMM_BM;
constexpr int kBN = BELAY_GEMM_BN;
constexpr int kBK = 64;
static_assert((kBM == 128 || kBM == 256) && (kBN == 128 || kBN == 256), "BELAY_GEMM_BM, BELAY_GEMM_BN: 128 or 256");
constexpr int kWarpM = 64;
constexpr int kWarpsM = kBM / kWarpM;  // 2 (4 with BM 256)
constexpr int kWarpsN = BELAY_GEMM_WARPS_N;
static_assert(kWarpsN > 0 && kBN % kWarpsN == 0 && (kBN / kWarpsN == 64 || kBN / kWarpsN == 32),
              "BELAY_GEMM_WARPS_N: BN / WARPS_N must be 64 (64 x 64 warp tiles) or 32 (64 x 32)");
constexpr int kWarps = kWarpsM * kWarpsN;
static_assert(kWarps <= 8, "at most 8 warps: 128 accumulators a thread leave room for 256 threads a block");
constexpr int kThreads = kWarps * 32;
constexpr int kWarpN = kBN / kWarpsN;  // 64 (32 with BELAY_GEMM_WARPS_N=4 and BN 128)
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kWarpTilesM = kWarpM / kMmaM;  // 4
constexpr int kWarpTilesN = kWarpN / kMmaN;  // 8 (4 with 64 x 32 warp tiles)
constexpr int kStages = BELAY_GEMM_STAGES;   // cp.async pipeline depth
static_assert(kStages >= 2 && kStages <= 4, "BELAY_GEMM_STAGES: 2, 3 or 4");
constexpr int kGroupM = BELAY_GEMM_GROUP_M;
static_assert(kGroupM >= 1, "BELAY_GEMM_GROUP_M: 1 (off) or more tile rows per group");
constexpr bool kHoist = BELAY_GEMM_HOIST != 0;
constexpr int kChunkElems = 8;               // 16 bytes of FP16/BF16
constexpr int kATileElems = kBM * kBK;       // elements of A's tile in a stage, either layout
constexpr int kBTileElems = kBN * kBK;       // B's
constexpr int kStageElems = kATileElems + kBTileElems;  // A tile then B tile
// 96 KiB by default (144 KiB for 128 x 256, 192 KiB with 4 stages): needs the dynamic-smem opt-in.
constexpr int kSmemBytes = kStages * kStageElems * 2;
static_assert(kSmemBytes <= 227 * 1024, "more shared memory than a block may have on sm_90");
// Blocks per SM the kernel is built for (__launch_bounds__): two when both registers (128
// threads x 255) and shared memory (228 KiB an SM, 1 KiB of it reserved per block) allow.
constexpr int kBlocksPerSm = kThreads == 128 && 2 * (kSmemBytes + 1024) <= 228 * 1024 ? 2 : 1;

BELAY_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Shared-memory layout of one operand tile ------------------------------------------
// A tile is stored as the global matrix is: `rows` rows of `chunks` 16-byte chunks. K-major
// operands (A not transposed, B transposed) give 128 rows x 8 chunks; M/N-major operands
// give 64 rows (k) x 16 chunks. The swizzle XORs the low three bits of the chunk index with
// the row: the 8 rows that one ldmatrix phase reads at one logical chunk land in 8
// different 16-byte bank groups, and 8 consecutive chunks of one row stay a permutation of
// the same 8 groups (cp.async writes stay conflict-free too). Needs chunks % 8 == 0.
BELAY_HD constexpr int swizzle_chunk(int row, int chunk) { return chunk ^ (row & 7); }

// Element offset of (row, chunk) in a tile of `chunks` chunks per row.
BELAY_HD constexpr int tile_offset(int row, int chunk, int chunks) {
  return row * chunks * kChunkElems + swizzle_chunk(row, chunk) * kChunkElems;
}

// cp.async copies whole 16-byte chunks, so every stored row must start 16-byte aligned: an
// operand whose row length is not a multiple of 8 is copied into rows of padded_ld(ld)
// elements, zero-filled past the end. A chunk that starts inside a row then ends inside the
// row or its padding, never in the next row.
BELAY_HD constexpr int64_t padded_ld(int64_t ld) { return ceil_div(ld, kChunkElems) * kChunkElems; }

// The tile shape in the stored layout of an operand whose tile spans `mn` rows of op(A)
// (kBM, for A) or columns of op(B) (kBN, for B).
struct TileShape {
  int rows;
  int chunks;
};
BELAY_HD constexpr TileShape operand_tile(bool k_major, int mn) {
  return k_major ? TileShape{mn, kBK / kChunkElems} : TileShape{kBK, mn / kChunkElems};
}

// Which 16-byte chunk of the tile a thread copies on pass `pass`: consecutive threads take
// consecutive chunks of one row, so a warp reads 512 contiguous bytes of global memory.
// Passes per tile of extent mn: 8 for a 128-wide tile and 128 threads (4 with 256 threads).
BELAY_HD constexpr int load_passes(int mn) { return mn * kBK / kChunkElems / kThreads; }
static_assert(kATileElems / kChunkElems % kThreads == 0 && kBTileElems / kChunkElems % kThreads == 0,
              "every thread copies the same number of chunks");
struct ChunkPos {
  int row;
  int chunk;
};
BELAY_HD constexpr ChunkPos load_chunk(int thread, int pass, int chunks) {
  const int id = pass * kThreads + thread;
  return {id / chunks, id % chunks};
}

// What a thread copies on pass `pass` when it loads an operand tile of extent `mn` (kBM or
// kBN): stored rows
// [row0, row0 + rows) and chunks from column col0, where (row, column) is (mn, k) for a
// K-major operand and (k, mn) otherwise. `dst` is the element offset in the stage, `src`
// the element offset in the operand (rows of `ld` elements, ld % 8 == 0); a chunk outside
// the operand (inside == false) is zero-filled instead. Since ld % 8 == 0, a chunk that
// starts inside a row ends inside it or in its zero padding: copied or zeroed whole.
struct ChunkCopy {
  int dst;
  int64_t src;
  bool inside;
};
BELAY_HD constexpr ChunkCopy tile_chunk_copy(bool k_major, int mn, int thread, int pass, int64_t ld, int mn_total,
                                             int k_total, int mn0, int k0) {
  const TileShape s = operand_tile(k_major, mn);
  const int rows_total = k_major ? mn_total : k_total;
  const int cols_total = k_major ? k_total : mn_total;
  const int row0 = k_major ? mn0 : k0;
  const int col0 = k_major ? k0 : mn0;
  const ChunkPos p = load_chunk(thread, pass, s.chunks);
  const int grow = row0 + p.row, gcol = col0 + p.chunk * kChunkElems;
  const bool inside = grow < rows_total && gcol < cols_total;
  return {tile_offset(p.row, p.chunk, s.chunks), inside ? static_cast<int64_t>(grow) * ld + gcol : 0, inside};
}

// ---- The loader's addresses, hoisted (kHoist) ----------------------------------------------
// Since kThreads is a multiple of a row's chunks, a thread copies the same chunk of every
// row it visits, rows row_step apart from pass to pass; and since row_step is a multiple of
// 8, the swizzle (row & 7) is the same on every pass, so the stage offset advances by a
// constant too. What stays is one row, chunk and stage offset per thread and operand,
// computed once; a pass adds compile-time steps (tests/kernels/test_cuda_index_math.cpp
// checks it against load_chunk and tile_offset).
BELAY_HD constexpr int load_row_step(bool k_major, int mn) { return kThreads / operand_tile(k_major, mn).chunks; }
BELAY_HD constexpr int load_dst_step(bool k_major, int mn) {
  return load_row_step(k_major, mn) * operand_tile(k_major, mn).chunks * kChunkElems;
}
static_assert(kThreads % (kBM / kChunkElems) == 0 && kThreads % (kBN / kChunkElems) == 0 &&
                  kThreads / (kBM / kChunkElems) % 8 == 0 && kThreads / (kBN / kChunkElems) % 8 == 0,
              "the hoisted loader needs whole rows per pass and a pass step that keeps the swizzle");
struct LoadPlan {
  int row;    // stored row of pass 0 in the tile
  int chunk;  // logical chunk in the row, the same on every pass
  int dst;    // stage offset of pass 0's chunk
};
BELAY_HD constexpr LoadPlan load_plan(bool k_major, int mn, int thread) {
  const int chunks = operand_tile(k_major, mn).chunks;
  const ChunkPos p = load_chunk(thread, 0, chunks);
  return {p.row, p.chunk, tile_offset(p.row, p.chunk, chunks)};
}

// ---- 16-byte bank groups -------------------------------------------------------------
// Shared memory has 32 banks of 4 bytes; a 16-byte access touches 4 consecutive banks, so
// 8 accesses of 16 bytes are conflict-free exactly when their (byte offset / 16) % 8 differ.
BELAY_HD constexpr int bank_group_of_offset(int element_offset) { return (element_offset * 2 / 16) % 8; }

// ---- ldmatrix sources ------------------------------------------------------------------
// ldmatrix.x4 loads four 8x8 matrices of 16-bit values; lanes 8j..8j+7 give the row
// addresses of matrix j. Each function returns, for a lane, the (row, chunk) it addresses,
// relative to the corner of the 16x16 block (rows and chunks in the stored layout).
struct LdsmSource {
  int row;
  int chunk;
};
// A, K-major (stored [m][k]), no .trans: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15)
// (m8-15,k8-15) become a0..a3.
BELAY_HD constexpr LdsmSource ldsm_a_kmajor(int lane) { return {lane % 16, lane / 16}; }
// A, M-major (stored [k][m]), with .trans: matrices (k0-7,m0-7) (k0-7,m8-15) (k8-15,m0-7)
// (k8-15,m8-15).
BELAY_HD constexpr LdsmSource ldsm_a_mmajor(int lane) { return {lane % 8 + 8 * (lane / 16), (lane / 8) % 2}; }
// B, K-major (stored [n][k]), no .trans, two n8 tiles: matrices (n0-7,k0-7) (n0-7,k8-15)
// (n8-15,k0-7) (n8-15,k8-15) become b0,b1 of tile 0 then b0,b1 of tile 1.
BELAY_HD constexpr LdsmSource ldsm_b_kmajor(int lane) { return {lane % 8 + 8 * (lane / 16), (lane / 8) % 2}; }
// B, N-major (stored [k][n]), with .trans: matrices (k0-7,n0-7) (k8-15,n0-7) (k0-7,n8-15)
// (k8-15,n8-15).
BELAY_HD constexpr LdsmSource ldsm_b_nmajor(int lane) { return {lane % 8 + 8 * ((lane / 8) % 2), lane / 16}; }

// The stage offset (elements) a lane gives ldmatrix.x4 for A's m16 tile `mi` of the warp
// whose rows start at wm, at k offset kk within the k-tile: K-major without .trans, M-major
// with it (the four matrices then are a0..a3).
BELAY_HD constexpr int a_ldsm_offset(bool k_major, int lane, int wm, int mi, int kk) {
  const int chunks = operand_tile(k_major, kBM).chunks;
  if (k_major) {
    const LdsmSource src = ldsm_a_kmajor(lane);
    return tile_offset(wm + mi * kMmaM + src.row, kk / kChunkElems + src.chunk, chunks);
  }
  const LdsmSource src = ldsm_a_mmajor(lane);
  return tile_offset(kk + src.row, (wm + mi * kMmaM) / kChunkElems + src.chunk, chunks);
}
// The same for B's pair of n8 tiles `pair` (columns wn + 16 pair ...): registers 0, 1 of the
// result are b0, b1 of tile 2 pair, registers 2, 3 those of tile 2 pair + 1.
BELAY_HD constexpr int b_ldsm_offset(bool k_major, int lane, int wn, int pair, int kk) {
  const int chunks = operand_tile(k_major, kBN).chunks;
  if (k_major) {
    const LdsmSource src = ldsm_b_kmajor(lane);
    return tile_offset(wn + pair * 16 + src.row, kk / kChunkElems + src.chunk, chunks);
  }
  const LdsmSource src = ldsm_b_nmajor(lane);
  return tile_offset(kk + src.row, (wn + pair * 16) / kChunkElems + src.chunk, chunks);
}

// The same offsets split for kHoist into a part that a lane keeps in a register for the
// whole k loop (the "fixed" offset, *_ldsm_fixed: one of four per operand) and a constant
// step. Moving 16 rows (the next m16 or n16 block of a K-major tile) or 16 k (the next k16
// step of an M/N-major tile) keeps row & 7, so the swizzle is unchanged and the move is a
// constant; the other move XORs the chunk and stays in the fixed part. Index i of the fixed
// part is kk / 16 for a K-major operand, mi (A) or pair (B) otherwise.
BELAY_HD constexpr int a_ldsm_fixed(bool k_major, int lane, int wm, int i) {
  return k_major ? a_ldsm_offset(true, lane, wm, 0, i * kMmaK) : a_ldsm_offset(false, lane, wm, i, 0);
}
BELAY_HD constexpr int a_ldsm_step(bool k_major, int mi, int kk) { return k_major ? mi * kMmaM * kBK : kk * kBM; }
BELAY_HD constexpr int a_ldsm_index(bool k_major, int mi, int kk) { return k_major ? kk / kMmaK : mi; }
BELAY_HD constexpr int b_ldsm_fixed(bool k_major, int lane, int wn, int i) {
  return k_major ? b_ldsm_offset(true, lane, wn, 0, i * kMmaK) : b_ldsm_offset(false, lane, wn, i, 0);
}
BELAY_HD constexpr int b_ldsm_step(bool k_major, int pair, int kk) { return k_major ? pair * 16 * kBK : kk * kBN; }
BELAY_HD constexpr int b_ldsm_index(bool k_major, int pair, int kk) { return k_major ? kk / kMmaK : pair; }
// How many fixed offsets a lane keeps per operand.
constexpr int kLdsmFixedA = kBK / kMmaK > kWarpTilesM ? kBK / kMmaK : kWarpTilesM;          // 4
constexpr int kLdsmFixedB = kBK / kMmaK > kWarpTilesN / 2 ? kBK / kMmaK : kWarpTilesN / 2;  // 4

// What ldmatrix hands a lane: half `h` (0 or 1) of its register from an 8x8 matrix is the
// element at (row, col) of that matrix as stored; .trans swaps the roles.
struct Coord {
  int row;
  int col;
};
BELAY_HD constexpr Coord ldmatrix_element(int lane, int h, bool trans) {
  return trans ? Coord{2 * (lane % 4) + h, lane / 4} : Coord{lane / 4, 2 * (lane % 4) + h};
}

// ---- mma.sync.m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16") ---------
// groupID = lane / 4, threadID_in_group = lane % 4.
// A (16x16, row-major): reg r in 0..3, half h: row = g + 8*(r % 2), col = 2t + h + 8*(r / 2).
BELAY_HD constexpr Coord mma_a_element(int lane, int reg, int h) {
  return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + h + 8 * (reg / 2)};
}
// B (16x8, "col"): reg r in 0..1, half h: k = 2t + h + 8r, n = g.  Returned as (k, n).
BELAY_HD constexpr Coord mma_b_element(int lane, int reg, int h) {
  return {2 * (lane % 4) + h + 8 * reg, lane / 4};
}
// C/D (16x8, FP32): reg r in 0..3: row = g + 8*(r / 2), col = 2t + (r % 2).
BELAY_HD constexpr Coord mma_c_element(int lane, int reg) { return {lane / 4 + 8 * (reg / 2), 2 * (lane % 4) + reg % 2}; }

// ---- Which tile of C a block computes ---------------------------------------------------
// Blocks start roughly in the order of their linear index x + y * gridDim.x. With
// kGroupM == 1 block (x, y) computes tile (bm, bn) = (y, x): one row of tiles after another,
// so the blocks resident at once read a few row tiles of A and all of B. With kGroupM > 1
// consecutive indices walk down kGroupM tile rows, then move one tile column right: a wave
// reads kGroupM row tiles of A and a few column tiles of B (the last group may be shorter).
// A bijection of the grid onto the tiles (tests/kernels/test_cuda_index_math.cpp).
struct BlockTile {
  int64_t bm;
  int64_t bn;
};
BELAY_HD constexpr BlockTile block_tile(int64_t x, int64_t y, int64_t tiles_n, int64_t tiles_m) {
  if (kGroupM <= 1) return {y, x};
  const int64_t id = y * tiles_n + x;
  const int64_t per_group = static_cast<int64_t>(kGroupM) * tiles_n;
  const int64_t first_m = id / per_group * kGroupM;
  const int64_t rows = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  const int64_t in_group = id % per_group;
  return {first_m + in_group % rows, in_group / rows};
}

// ---- Where an accumulator lands in C ----------------------------------------------------
// Block (bm, bn), warp w, tile (mi, ni), lane, register -> (row, col) of C. The epilogue
// writes it only when row < M and col < N: that predicate is the whole edge handling.
struct Coord64 {
  int64_t row;
  int64_t col;
};
BELAY_HD constexpr Coord64 c_element(int64_t bm, int64_t bn, int warp, int mi, int ni, int lane, int reg) {
  const Coord in_tile = mma_c_element(lane, reg);
  return {bm * kBM + (warp / kWarpsN) * kWarpM + mi * kMmaM + in_tile.row,
          bn * kBN + (warp % kWarpsN) * kWarpN + ni * kMmaN + in_tile.col};
}

// ---- The FP32 SIMT kernel -----------------------------------------------------------------
// 64 x 64 tile per block of 256 threads, each thread a 4 x 4 micro-tile strided by 16 so
// that a warp's loads from shared memory are consecutive; BK = 16.
constexpr int kF32Tile = 64;
constexpr int kF32BK = 16;
constexpr int kF32Threads = 256;
constexpr int kF32Micro = 4;
BELAY_HD constexpr Coord64 f32_element(int64_t bm, int64_t bn, int thread, int i, int j) {
  return {bm * kF32Tile + (thread / 16) + 16 * i, bn * kF32Tile + (thread % 16) + 16 * j};
}

}  // namespace belay::gemm
