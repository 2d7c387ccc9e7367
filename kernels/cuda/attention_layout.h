// The index math of the CUDA attention kernels (attention_kernels.cu), apart from them so that
// a plain C++ compiler checks it without a GPU (tests/kernels/test_cuda_attention_layout.cpp):
// tile sizes, which chunk each thread copies into the swizzled K / V / Q tiles, the address
// each lane gives ldmatrix, which score a fragment register holds, the causal mask and which
// tiles a block visits. The fragment layouts and the swizzle are the GEMM's (gemm_layout.h).
#pragma once
#include <cstdint>

#include "kernels/cuda/gemm_layout.h"

namespace belay::attn {

using gemm::ceil_div;
using gemm::kChunkElems;

// ---- The tensor-core forward (FP16 / BF16) ---------------------------------------------
// A block is one item's 64 query rows, 4 warps of 16 rows each (one m16 tile of mma); it
// walks that item's keys 64 at a time. The head dim is padded to kD = 64 or 128 halves so a
// stored row is 8 or 16 whole 16-byte chunks: the GEMM's XOR swizzle (which needs a multiple
// of 8 chunks) then keeps every ldmatrix phase and every cp.async store conflict-free.
constexpr int kBr = 64;                // query rows per block
constexpr int kBc = 64;                // keys per tile
constexpr int kWarps = kBr / gemm::kMmaM;  // 4
constexpr int kThreads = kWarps * 32;      // 128
constexpr int kKeyTilesN = kBc / gemm::kMmaN;  // 8 n8 tiles of scores per warp and key tile

BELAY_HD constexpr int padded_head_dim(int64_t d) { return d <= 64 ? 64 : 128; }
BELAY_HD constexpr int row_chunks(int kd) { return kd / kChunkElems; }
// Elements of one [64][kD] tile; shared memory holds Q, then 2 stages of K, then 2 of V.
BELAY_HD constexpr int tile_elems(int kd) { return kBr * kd; }
BELAY_HD constexpr int smem_bytes(int kd) { return 5 * tile_elems(kd) * 2; }  // 40 or 80 KiB

// Which (row, chunk) of a [64][kD] tile thread `thread` copies on pass `pass`: consecutive
// threads take consecutive chunks of a row, so a warp reads whole rows of global memory.
BELAY_HD constexpr int load_passes(int kd) { return tile_elems(kd) / kChunkElems / kThreads; }
struct TileChunk {
  int row, chunk;
  int dst;  // element offset in the swizzled tile
};
BELAY_HD constexpr TileChunk tile_chunk(int thread, int pass, int kd) {
  const int id = pass * kThreads + thread, chunks = row_chunks(kd);
  const int row = id / chunks, chunk = id % chunks;
  return {row, chunk, gemm::tile_offset(row, chunk, chunks)};
}
// Whether that chunk holds data: a row of the item (row0 + row < rows) and a column of the
// stored row (ld, a multiple of 8). Outside, cp.async copies 0 bytes and zero-fills it: the
// padding of d to kD and the last partial tile of queries or keys.
BELAY_HD constexpr bool chunk_inside(const TileChunk& c, int row0, int rows, int ld) {
  return row0 + c.row < rows && c.chunk * kChunkElems < ld;
}

// ldmatrix.x4 addresses (element offsets in a tile), per lane:
// Q (mma's A, stored [query][d], d-major: no .trans), warp w's 16 rows at d offset kk.
BELAY_HD constexpr int q_ldsm_offset(int lane, int warp, int kk, int kd) {
  const gemm::LdsmSource s = gemm::ldsm_a_kmajor(lane);
  return gemm::tile_offset(warp * gemm::kMmaM + s.row, kk / kChunkElems + s.chunk, row_chunks(kd));
}
// K (B of S = Q K^T, stored [key][d]: K-major, no .trans): keys 16 pair .. 16 pair + 15 at d
// offset kk; registers 0, 1 are b0, b1 of n8 tile 2 pair, registers 2, 3 those of 2 pair + 1.
BELAY_HD constexpr int k_ldsm_offset(int lane, int pair, int kk, int kd) {
  const gemm::LdsmSource s = gemm::ldsm_b_kmajor(lane);
  return gemm::tile_offset(pair * 16 + s.row, kk / kChunkElems + s.chunk, row_chunks(kd));
}
// V (B of O = P V, stored [key][d]: N-major, with .trans): keys kk .. kk + 15 (the k of this
// product), d columns 16 pair .. 16 pair + 15 (two n8 tiles, as for K).
BELAY_HD constexpr int v_ldsm_offset(int lane, int pair, int kk, int kd) {
  const gemm::LdsmSource s = gemm::ldsm_b_nmajor(lane);
  return gemm::tile_offset(kk + s.row, pair * 2 + s.chunk, row_chunks(kd));
}

// Score register r of n8 tile ni (a C fragment): its row in the warp's 16 and key in the tile.
struct ScorePos {
  int row, key;
};
BELAY_HD constexpr ScorePos score_pos(int lane, int ni, int r) {
  const gemm::Coord c = gemm::mma_c_element(lane, r);
  return {c.row, ni * gemm::kMmaN + c.col};
}
// The A fragment of P V for keys 16 kt2 .. +15 is made of two score tiles: an accumulator
// (row g + 8 (r / 2), col 2t + r % 2) is where A register (r / 2) + 2 half expects it, so
// A register a takes scores tile 2 kt2 + a / 2, registers 2 (a % 2) and 2 (a % 2) + 1.
BELAY_HD constexpr int p_score_tile(int kt2, int a_reg) { return 2 * kt2 + a_reg / 2; }
BELAY_HD constexpr int p_score_reg(int a_reg, int h) { return 2 * (a_reg % 2) + h; }

// ---- The tensor-core backward (FP16 / BF16) ------------------------------------------------
// Two kernels of kWarps warps on the forward's tiles, loader, swizzle and ldmatrix addresses (a
// tile is 64 rows of [kD] halves, whatever it holds):
//  - dK / dV: a block per (item, 64 keys), a warp per 16 keys (the m16 of S^T = K Q^T). K and V
//    stay in shared memory; Q and dO stream by, 64 queries a tile, double-buffered, each stage
//    with its queries' lse (log2 units) and D in FP32 beside it.
//  - dQ: a block per (item, 64 queries), a warp per 16 queries as in the forward; Q and dO stay,
//    K and V stream by, double-buffered.
constexpr int kBwdTiles = 6;  // 2 resident tiles + 2 streamed tiles x 2 stages
BELAY_HD constexpr int bwd_tiles_bytes(int kd) { return kBwdTiles * tile_elems(kd) * 2; }
BELAY_HD constexpr int dq_smem_bytes(int kd) { return bwd_tiles_bytes(kd); }  // 48 or 96 KiB
// dK / dV adds the rows' floats after the tiles: stage s holds lse at [2 s kBr, +kBr) and D
// after them. 49 or 97 KiB.
BELAY_HD constexpr int dkv_row_floats(int stage, bool dsum) { return 2 * kBr * stage + (dsum ? kBr : 0); }
BELAY_HD constexpr int dkv_smem_bytes(int kd) { return bwd_tiles_bytes(kd) + 2 * 2 * kBr * 4; }
// Who stages the rows' floats: thread t copies lse (t < kBr) or D (t >= kBr) of query t % kBr.
static_assert(kThreads == 2 * kBr, "a thread per lse and per D value of a query tile");

// Which (item, tile) block `block` of a grid of items x tiles works on. The blocks go out by
// tile, across the items, so that under the causal mask the heaviest tiles start first and the
// grid ends on light ones: dK / dV's first key tile visits every query tile (ascending order),
// dQ's last query tile every key tile (last_first).
struct BlockTile {
  int64_t item, tile;
};
BELAY_HD constexpr BlockTile bwd_block_tile(int64_t block, int64_t items, int64_t tiles, bool last_first) {
  const int64_t rank = block / items;
  return {block % items, last_first ? tiles - 1 - rank : rank};
}

// ---- The mask and the tiles a block visits (every kernel, forward and backward) ------------
// causal: query i sees key j when j <= i + tk - tq (engine/backend.h).
BELAY_HD constexpr bool sees(bool causal, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  return j < tk && (!causal || j <= i + tk - tq);
}
// The same with the query's own bound (query i < tq sees key j), from 32-bit indices: the
// backward's inner loops.
BELAY_HD constexpr bool sees_in(bool causal, int i, int j, int tq, int tk) {
  return i < tq && sees(causal, i, j, tq, tk);
}
// Whether queries [i0, i0 + nq) see every key of [j0, j0 + nk): all inside, none masked (then
// the backward skips the mask for that part of a tile: every causal tile below the diagonal).
BELAY_HD constexpr bool all_live(bool causal, int i0, int nq, int j0, int nk, int tq, int tk) {
  return i0 + nq <= tq && j0 + nk <= tk && (!causal || j0 + nk - 1 - i0 <= tk - tq);
}
// How many tiles of `bc` keys queries [q0, q0 + br) visit: every tile holding a key that one
// of them sees, so the causal tiles past the diagonal are skipped (0 when none sees any key).
BELAY_HD constexpr int key_tiles(bool causal, int64_t q0, int br, int64_t tq, int64_t tk, int bc) {
  if (!causal) return static_cast<int>(ceil_div(tk, bc));
  const int64_t last = q0 + br - 1 < tq - 1 ? q0 + br - 1 : tq - 1;  // last query of the tile
  const int64_t keys = last + tk - tq + 1;                           // it sees keys [0, keys)
  if (keys <= 0) return 0;
  return static_cast<int>(ceil_div(keys < tk ? keys : tk, bc));
}
// The first query that sees key j0 (causal), i.e. the queries a key tile starting at j0 can
// skip in the backward: i >= j0 - (tk - tq).
BELAY_HD constexpr int64_t first_query(bool causal, int64_t j0, int64_t tq, int64_t tk) {
  if (!causal) return 0;
  const int64_t i = j0 - (tk - tq);
  return i < 0 ? 0 : i;
}

// The first query tile (of kBr rows) that keys [j0, j0 + kBc) need in the backward: the tile of
// the first query that sees key j0; the tiles before it see none of the block's keys.
BELAY_HD constexpr int64_t first_query_tile(bool causal, int64_t j0, int64_t tq, int64_t tk) {
  return first_query(causal, j0, tq, tk) / kBr;
}

// ---- The SIMT kernels (the FP32 forward, and the backward in every dtype) ------------------
// kSimtRows rows (queries, or keys for dK/dV) per block, kLanesPerRow threads per row: a
// thread owns the columns c = sub + kLanesPerRow * i of its row, and a dot product over d is
// the thread's part then an XOR-shuffle tree over the row's lanes (the same sum, the same
// bits, on each of them). Keys (or queries) stream through shared memory kSimtCols at a time.
constexpr int kLanesPerRow = 4;
constexpr int kSimtRows = 32;
constexpr int kSimtCols = 32;
constexpr int kSimtThreads = kSimtRows * kLanesPerRow;  // 128
BELAY_HD constexpr int simt_head_dim(int64_t d) { return d <= 32 ? 32 : d <= 64 ? 64 : 128; }
struct SimtLane {
  int row, sub;
};
BELAY_HD constexpr SimtLane simt_lane(int thread) { return {thread / kLanesPerRow, thread % kLanesPerRow}; }
BELAY_HD constexpr int simt_col(int sub, int i) { return sub + kLanesPerRow * i; }

}  // namespace belay::attn
