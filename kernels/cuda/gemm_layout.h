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
// A block computes a 128 x 128 tile of C with 4 warps in a 2 (M) x 2 (N) grid, so a warp
// owns 64 x 64: 4 m16 tiles times 8 n8 tiles = 32 mma per k16 step, 128 FP32 accumulators
// per thread (226-252 registers, no spill). Why 64 x 64 and not 64 x 32 with 8 warps: per
// mma a warp then reads 128 bytes of shared memory through ldmatrix instead of 192, and at
// 128 bytes per clock per SM, 192 would let shared memory, not the tensor cores, set the
// pace of mma.sync on Hopper (our arithmetic, not yet measured); two such blocks fit an SM
// (registers: 2 x 128 x 256; shared memory: 2 x 96 KiB, on sm_90), so one block's barrier
// does not idle the tensor cores.
// BELAY_GEMM_WARPS_N=4 at compile time gives the 2 x 4 grid of 64 x 32 warp tiles (one
// 256-thread block per SM) instead: bench/gpu-check.sh measures both; the CPU tests run
// the index math of both (tests/CMakeLists.txt).
// BK = 64 halves makes a K-major smem row exactly 128 bytes (8 chunks of 16 B), the width
// over which the XOR swizzle below spreads 8 rows across all 32 banks.
#ifndef BELAY_GEMM_WARPS_N
#define BELAY_GEMM_WARPS_N 2
#endif
constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = BELAY_GEMM_WARPS_N;
static_assert(kWarpsN == 2 || kWarpsN == 4, "BELAY_GEMM_WARPS_N: 2 (64 x 64 warp tiles) or 4 (64 x 32)");
constexpr int kWarps = kWarpsM * kWarpsN;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpM = kBM / kWarpsM;  // 64
constexpr int kWarpN = kBN / kWarpsN;  // 64 (32 with 8 warps)
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kWarpTilesM = kWarpM / kMmaM;  // 4
constexpr int kWarpTilesN = kWarpN / kMmaN;  // 8 (4 with 8 warps)
constexpr int kStages = 3;                   // cp.async pipeline depth
constexpr int kChunkElems = 8;               // 16 bytes of FP16/BF16
constexpr int kTileElems = kBM * kBK;        // elements of one operand tile (A or B), either layout
static_assert(kBM == kBN, "one loader shape serves A and B");
constexpr int kStageElems = 2 * kTileElems;  // A tile then B tile
constexpr int kSmemBytes = kStages * kStageElems * 2;  // 96 KiB: needs the dynamic-smem opt-in

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

// The tile shape in the stored layout.
struct TileShape {
  int rows;
  int chunks;
};
BELAY_HD constexpr TileShape operand_tile(bool k_major) {
  return k_major ? TileShape{kBM, kBK / kChunkElems} : TileShape{kBK, kBM / kChunkElems};
}

// Which 16-byte chunk of the tile a thread copies on pass `pass`: consecutive threads take
// consecutive chunks of one row, so a warp reads 512 contiguous bytes of global memory.
constexpr int kLoadPasses = kTileElems / kChunkElems / kThreads;  // 8 (4 with 8 warps)
static_assert(kTileElems / kChunkElems % kThreads == 0, "every thread copies the same number of chunks");
struct ChunkPos {
  int row;
  int chunk;
};
BELAY_HD constexpr ChunkPos load_chunk(int thread, int pass, int chunks) {
  const int id = pass * kThreads + thread;
  return {id / chunks, id % chunks};
}

// What a thread copies on pass `pass` when it loads an operand tile: stored rows
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
BELAY_HD constexpr ChunkCopy tile_chunk_copy(bool k_major, int thread, int pass, int64_t ld, int mn_total,
                                             int k_total, int mn0, int k0) {
  const TileShape s = operand_tile(k_major);
  const int rows_total = k_major ? mn_total : k_total;
  const int cols_total = k_major ? k_total : mn_total;
  const int row0 = k_major ? mn0 : k0;
  const int col0 = k_major ? k0 : mn0;
  const ChunkPos p = load_chunk(thread, pass, s.chunks);
  const int grow = row0 + p.row, gcol = col0 + p.chunk * kChunkElems;
  const bool inside = grow < rows_total && gcol < cols_total;
  return {tile_offset(p.row, p.chunk, s.chunks), inside ? static_cast<int64_t>(grow) * ld + gcol : 0, inside};
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
  const int chunks = operand_tile(k_major).chunks;
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
  const int chunks = operand_tile(k_major).chunks;
  if (k_major) {
    const LdsmSource src = ldsm_b_kmajor(lane);
    return tile_offset(wn + pair * 16 + src.row, kk / kChunkElems + src.chunk, chunks);
  }
  const LdsmSource src = ldsm_b_nmajor(lane);
  return tile_offset(kk + src.row, (wn + pair * 16) / kChunkElems + src.chunk, chunks);
}

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
