// The CUDA attention kernels' index math (kernels/cuda/attention_layout.h), checked on the CPU:
// the tile loader covers every chunk once without bank conflicts, the Q / K / V ldmatrix
// addresses hit 8 bank groups per phase and deliver exactly the mma fragments from the
// swizzled tiles, the score accumulators are P's A fragment, and the mask and the tiles a
// block visits cover every key a query sees (and skip only keys none sees). The backward's:
// blocks to (item, tile), the query tiles a key tile skips, its shared-memory layout, and
// P's A fragment when dK / dV works in parts of 32 queries.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "kernels/cuda/attention_layout.h"

using namespace belay;
using namespace belay::attn;

namespace {

// Which tile and which ldmatrix address function, and whether it uses .trans.
enum class Operand { Q, K, V };
int ldsm_offset(Operand op, int lane, int block, int kk, int kd) {
  switch (op) {
    case Operand::Q: return q_ldsm_offset(lane, block, kk, kd);  // block: the warp
    case Operand::K: return k_ldsm_offset(lane, block, kk, kd);  // block: the key pair
    default: return v_ldsm_offset(lane, block, kk, kd);          // block: the d pair
  }
}
// The (block, kk) ranges each operand is read at, for head dim kd.
int blocks_of(Operand op, int kd) { return op == Operand::Q ? kWarps : op == Operand::K ? kBc / 16 : kd / 16; }
int ksteps_of(Operand op, int kd) { return op == Operand::V ? kBc : kd; }

}  // namespace

TEST_CASE("attention: the tile loader copies every chunk once, conflict-free", "[kernels][cuda-index]") {
  for (int kd : {64, 128}) {
    std::vector<int> hits(static_cast<size_t>(kBr * row_chunks(kd)), 0);
    for (int pass = 0; pass < load_passes(kd); ++pass) {
      for (int t = 0; t < kThreads; ++t) {
        const TileChunk c = tile_chunk(t, pass, kd);
        REQUIRE(c.row < kBr);
        ++hits[static_cast<size_t>(c.row * row_chunks(kd) + c.chunk)];
      }
      for (int t0 = 0; t0 < kThreads; t0 += 8) {  // a 16-byte store is served 8 threads at a time
        std::set<int> groups;
        for (int t = t0; t < t0 + 8; ++t) groups.insert(gemm::bank_group_of_offset(tile_chunk(t, pass, kd).dst));
        CHECK(groups.size() == 8);
      }
    }
    for (int h : hits) REQUIRE(h == 1);
  }
}

TEST_CASE("attention: chunks past d or past the rows are zero-filled, the others copied", "[kernels][cuda-index]") {
  // d = 40 stored in rows of ld 40 and a tile of 64 rows starting at 64 of 65.
  for (int kd : {64, 128})
    for (int pass = 0; pass < load_passes(kd); ++pass)
      for (int t = 0; t < kThreads; ++t) {
        const TileChunk c = tile_chunk(t, pass, kd);
        CHECK(chunk_inside(c, 64, 65, 40) == (c.row == 0 && c.chunk < 5));
      }
}

TEST_CASE("attention: Q, K and V ldmatrix phases read 8 distinct bank groups", "[kernels][cuda-index]") {
  for (int kd : {64, 128})
    for (Operand op : {Operand::Q, Operand::K, Operand::V}) {
      int conflicts = 0;
      for (int block = 0; block < blocks_of(op, kd); ++block)
        for (int kk = 0; kk < ksteps_of(op, kd); kk += 16)
          for (int phase = 0; phase < 4; ++phase) {
            std::set<int> groups;
            for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane)
              groups.insert(gemm::bank_group_of_offset(ldsm_offset(op, lane, block, kk, kd)));
            conflicts += groups.size() != 8;
          }
      INFO("kd " << kd << " operand " << static_cast<int>(op));
      CHECK(conflicts == 0);
    }
}

TEST_CASE("attention: ldmatrix from the swizzled tiles delivers the mma fragments of Q, K^T and V",
          "[kernels][cuda-index]") {
  for (int kd : {64, 128}) {
    // Each tile holds value(row, col) = row * 1000 + col at its swizzled place ([row][d]).
    std::vector<int> tile(static_cast<size_t>(tile_elems(kd)), -1);
    for (int r = 0; r < kBr; ++r)
      for (int c = 0; c < kd; ++c)
        tile[static_cast<size_t>(gemm::tile_offset(r, c / kChunkElems, row_chunks(kd)) + c % kChunkElems)] = r * 1000 + c;
    for (Operand op : {Operand::Q, Operand::K, Operand::V}) {
      const bool trans = op == Operand::V;
      int mismatches = 0;
      for (int block = 0; block < blocks_of(op, kd); ++block)
        for (int kk = 0; kk < ksteps_of(op, kd); kk += 16)
          for (int lane = 0; lane < 32; ++lane)
            for (int j = 0; j < 4; ++j)
              for (int h = 0; h < 2; ++h) {
                const gemm::Coord e = gemm::ldmatrix_element(lane, h, trans);
                const int got = tile[static_cast<size_t>(ldsm_offset(op, 8 * j + e.row, block, kk, kd) + e.col)];
                int want;
                if (op == Operand::Q) {  // A[m = query][k = d]
                  const gemm::Coord f = gemm::mma_a_element(lane, j, h);
                  want = (block * 16 + f.row) * 1000 + kk + f.col;
                } else if (op == Operand::K) {  // B[k = d][n = key] = K[key][d], n8 tile j / 2
                  const gemm::Coord f = gemm::mma_b_element(lane, j % 2, h);
                  want = (block * 16 + 8 * (j / 2) + f.col) * 1000 + kk + f.row;
                } else {  // B[k = key][n = d] = V[key][d], n8 tile j / 2
                  const gemm::Coord f = gemm::mma_b_element(lane, j % 2, h);
                  want = (kk + f.row) * 1000 + block * 16 + 8 * (j / 2) + f.col;
                }
                mismatches += got != want;
              }
      INFO("kd " << kd << " operand " << static_cast<int>(op));
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("attention: the score accumulators are P's A fragment for P V", "[kernels][cuda-index]") {
  for (int kt2 = 0; kt2 < kBc / 16; ++kt2)
    for (int lane = 0; lane < 32; ++lane)
      for (int a = 0; a < 4; ++a)
        for (int h = 0; h < 2; ++h) {
          const gemm::Coord want = gemm::mma_a_element(lane, a, h);  // (query row, key in the 16)
          const ScorePos got = score_pos(lane, p_score_tile(kt2, a), p_score_reg(a, h));
          CHECK(got.row == want.row);
          CHECK(got.key == kt2 * 16 + want.col);
        }
}

TEST_CASE("attention: the visited key tiles hold every key a query sees, skipped ones none", "[kernels][cuda-index]") {
  for (bool causal : {false, true})
    for (int64_t tq : {1, 7, 64, 65, 130, 200})
      for (int64_t tk : {1, 9, 64, 65, 200})
        for (int br : {kBr, kSimtRows})
          for (int64_t q0 = 0; q0 < tq; q0 += br) {
            const int bc = br == kBr ? kBc : kSimtCols;
            const int tiles = key_tiles(causal, q0, br, tq, tk, bc);
            int64_t seen_end = 0;  // one past the last key any query of the block sees
            for (int64_t i = q0; i < q0 + br && i < tq; ++i)
              for (int64_t j = 0; j < tk; ++j)
                if (sees(causal, i, j, tq, tk)) seen_end = std::max(seen_end, j + 1);
            INFO("causal " << causal << " tq " << tq << " tk " << tk << " q0 " << q0 << " br " << br);
            CHECK(tiles == (seen_end + bc - 1) / bc);
          }
}

TEST_CASE("attention: the mask is the engine's, and the backward's first query is the first that sees",
          "[kernels][cuda-index]") {
  for (int64_t tq : {1, 7, 65})
    for (int64_t tk : {1, 9, 65}) {
      for (int64_t i = 0; i < tq; ++i)
        for (int64_t j = 0; j < tk + 2; ++j) {
          CHECK(sees(false, i, j, tq, tk) == (j < tk));
          CHECK(sees(true, i, j, tq, tk) == (j < tk && j <= i + tk - tq));
        }
      for (int64_t j0 = 0; j0 < tk; ++j0) {
        const int64_t first = first_query(true, j0, tq, tk);
        for (int64_t i = 0; i < tq; ++i)
          for (int64_t j = j0; j < tk; ++j)
            if (sees(true, i, j, tq, tk)) CHECK(i >= first);  // no skipped query sees the tile
        if (first < tq) CHECK(sees(true, first, j0, tq, tk));  // and the first does
      }
    }
}

// ---- The tensor-core backward ---------------------------------------------------------------

TEST_CASE("attention backward: every (item, tile) is one block, the heaviest causal tiles first", "[kernels][cuda-index]") {
  for (int64_t items : {1, 3, 48})
    for (int64_t tiles : {1, 2, 5, 16})
      for (bool last_first : {false, true}) {
        std::vector<int> hits(static_cast<size_t>(items * tiles), 0);
        int64_t prev_rank = -1;
        for (int64_t b = 0; b < items * tiles; ++b) {
          const BlockTile t = bwd_block_tile(b, items, tiles, last_first);
          REQUIRE(t.item >= 0);
          REQUIRE(t.item < items);
          REQUIRE(t.tile >= 0);
          REQUIRE(t.tile < tiles);
          ++hits[static_cast<size_t>(t.item * tiles + t.tile)];
          // dK / dV: key tile 0 (every query tile) first; dQ: the last query tile first.
          const int64_t rank = last_first ? tiles - 1 - t.tile : t.tile;
          CHECK(rank >= prev_rank);
          prev_rank = rank;
        }
        for (int h : hits) REQUIRE(h == 1);
      }
}

TEST_CASE("attention backward: the query tiles a key tile skips see none of its keys", "[kernels][cuda-index]") {
  for (bool causal : {false, true})
    for (int64_t tq : {1, 7, 64, 65, 130, 200})
      for (int64_t tk : {1, 9, 64, 65, 200})
        for (int64_t j0 = 0; j0 < tk; j0 += kBc) {
          const int64_t first = first_query_tile(causal, j0, tq, tk);
          INFO("causal " << causal << " tq " << tq << " tk " << tk << " j0 " << j0 << " first tile " << first);
          for (int64_t i = 0; i < std::min(first * kBr, tq); ++i)
            for (int64_t j = j0; j < std::min(j0 + kBc, tk); ++j) REQUIRE_FALSE(sees(causal, i, j, tq, tk));
          // and the first visited tile holds the first query that sees key j0, if one does
          const int64_t i_first = first_query(causal, j0, tq, tk);
          if (i_first < tq) CHECK(sees(causal, i_first, j0, tq, tk));
          if (i_first < tq) CHECK(i_first / kBr == first);
        }
}

TEST_CASE("attention backward: sees_in is the mask with the query's bound", "[kernels][cuda-index]") {
  for (bool causal : {false, true})
    for (int tq : {1, 7, 65})
      for (int tk : {1, 9, 65})
        for (int i = 0; i < tq + 66; ++i)
          for (int j = 0; j < tk + 66; ++j) CHECK(sees_in(causal, i, j, tq, tk) == (i < tq && sees(causal, i, j, tq, tk)));
}

TEST_CASE("attention backward: shared memory fits sm_80, the rows' floats after the tiles, stages apart",
          "[kernels][cuda-index]") {
  constexpr int kSm80OptIn = 163 * 1024;  // the largest dynamic shared memory a block may opt in to
  for (int kd : {64, 128}) {
    CHECK(dq_smem_bytes(kd) == kBwdTiles * kBr * kd * 2);
    CHECK(dkv_smem_bytes(kd) <= kSm80OptIn);
    CHECK(bwd_tiles_bytes(kd) % 16 == 0);  // the floats start 16-byte aligned after the tiles
    std::set<int> used;
    for (int stage = 0; stage < 2; ++stage)
      for (bool dsum : {false, true})
        for (int t = 0; t < kBr; ++t) {
          const int at = dkv_row_floats(stage, dsum) + t;
          CHECK(bwd_tiles_bytes(kd) + 4 * (at + 1) <= dkv_smem_bytes(kd));
          used.insert(at);
        }
    CHECK(used.size() == 4u * kBr);
  }
}

TEST_CASE("attention backward: in parts of 32 queries, P's A fragment meets the rows tile_pv reads",
          "[kernels][cuda-index]") {
  // tile_scores(..., pair0) leaves n8 tile 2 pair + x of the part in s[2 pair + x] (its ldmatrix
  // reads rows 16 (pair0 + pair) ...), so part `sub` of kN tiles holds the tile's n8 tiles
  // sub kN ... and tile_pv(..., pair0) multiplies A register (kt2, a) with rows 16 (pair0 + kt2).
  for (int kn : {4, 8})
    for (int sub = 0; sub < kKeyTilesN / kn; ++sub) {
      const int pair0 = sub * kn / 2;
      for (int kt2 = 0; kt2 < kn / 2; ++kt2)
        for (int lane = 0; lane < 32; ++lane)
          for (int a = 0; a < 4; ++a)
            for (int h = 0; h < 2; ++h) {
              const gemm::Coord want = gemm::mma_a_element(lane, a, h);  // (row, k within the 16)
              const ScorePos got = score_pos(lane, sub * kn + p_score_tile(kt2, a), p_score_reg(a, h));
              CHECK(got.row == want.row);
              CHECK(got.key == (pair0 + kt2) * 16 + want.col);  // the row of Y that k multiplies
            }
    }
}

TEST_CASE("attention backward: all_live holds exactly when every query of a part sees every key", "[kernels][cuda-index]") {
  for (bool causal : {false, true})
    for (int tq : {1, 7, 65, 130})
      for (int tk : {1, 9, 65, 130})
        for (int i0 = 0; i0 < tq; i0 += 16)
          for (int nq : {16, 32, 64})
            for (int j0 = 0; j0 < tk; j0 += 16)
              for (int nk : {16, 64}) {
                bool all = true;
                for (int i = i0; i < i0 + nq; ++i)
                  for (int j = j0; j < j0 + nk; ++j) all = all && sees_in(causal, i, j, tq, tk);
                INFO("causal " << causal << " tq " << tq << " tk " << tk << " queries " << i0 << "+" << nq << " keys "
                               << j0 << "+" << nk);
                REQUIRE(all_live(causal, i0, nq, j0, nk, tq, tk) == all);
              }
}
