// The CUDA kernels' index math, checked on the CPU (no GPU, no CUDA headers): the tensor-core
// GEMM's swizzle, bank conflicts of ldmatrix and cp.async, ldmatrix against the mma fragment
// layouts, and how tiles and the epilogue cover odd shapes; the row kernels' grid.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "kernels/cuda/gemm_layout.h"
#include "kernels/cuda/row_grid.h"

using namespace belay::gemm;

namespace {

// The stored tile shapes of both operands: K-major (extent rows x 8 chunks) and M/N-major
// (64 rows x extent / 8 chunks), for A's extent kBM and B's kBN (128 x 8 and 64 x 16 by default).
struct Shape {
  TileShape s;
  int mn;
};
const Shape kShapes[] = {{operand_tile(true, kBM), kBM}, {operand_tile(false, kBM), kBM},
                         {operand_tile(true, kBN), kBN}, {operand_tile(false, kBN), kBN}};

// Which ldmatrix source function serves an operand layout, and whether it uses .trans.
enum class Operand { AKMajor, AMMajor, BKMajor, BNMajor };
LdsmSource source(Operand op, int lane) {
  switch (op) {
    case Operand::AKMajor: return ldsm_a_kmajor(lane);
    case Operand::AMMajor: return ldsm_a_mmajor(lane);
    case Operand::BKMajor: return ldsm_b_kmajor(lane);
    default: return ldsm_b_nmajor(lane);
  }
}
bool k_major(Operand op) { return op == Operand::AKMajor || op == Operand::BKMajor; }
bool uses_trans(Operand op) { return !k_major(op); }
// The operand's tile extent along M (A) or N (B).
int extent(Operand op) { return op == Operand::AKMajor || op == Operand::AMMajor ? kBM : kBN; }

// The (row, chunk) corner in the stored tile of the 16x16 block a warp reads at k offset
// kk for its m (or n) offset mn: K-major stores [mn][k], the other layout [k][mn].
LdsmSource block_corner(Operand op, int mn, int kk) {
  return k_major(op) ? LdsmSource{mn, kk / kChunkElems} : LdsmSource{kk, mn / kChunkElems};
}

}  // namespace

TEST_CASE("the swizzle is a bijection on every stored tile shape", "[kernels][cuda-index]") {
  for (const auto [s, mn] : kShapes) {
    std::vector<int> hits(static_cast<size_t>(s.rows * s.chunks), 0);
    for (int r = 0; r < s.rows; ++r)
      for (int c = 0; c < s.chunks; ++c) {
        const int off = tile_offset(r, c, s.chunks);
        REQUIRE(off % kChunkElems == 0);
        REQUIRE(off >= 0);
        REQUIRE(off / kChunkElems < s.rows * s.chunks);
        // A chunk never leaves its row: a row's 16-byte chunks are permuted in place.
        REQUIRE(off / kChunkElems / s.chunks == r);
        ++hits[static_cast<size_t>(off / kChunkElems)];
      }
    for (int h : hits) REQUIRE(h == 1);
    CHECK(s.rows * s.chunks * kChunkElems == mn * kBK);
  }
}

TEST_CASE("ldmatrix phases read 8 distinct bank groups after the swizzle", "[kernels][cuda-index]") {
  for (Operand op : {Operand::AKMajor, Operand::AMMajor, Operand::BKMajor, Operand::BNMajor}) {
    const TileShape s = operand_tile(k_major(op), extent(op));
    int conflicts_swizzled = 0, conflicts_plain = 0;
    // Every 16x16 block any warp reads: every m/n offset (multiple of 16) and k step.
    for (int mn = 0; mn < extent(op); mn += 16)
      for (int kk = 0; kk < kBK; kk += kMmaK) {
        const LdsmSource corner = block_corner(op, mn, kk);
        for (int phase = 0; phase < 4; ++phase) {  // one 8x8 matrix per phase
          std::set<int> swizzled, plain;
          for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
            const LdsmSource src = source(op, lane);
            const int row = corner.row + src.row, chunk = corner.chunk + src.chunk;
            REQUIRE(row < s.rows);
            REQUIRE(chunk < s.chunks);
            swizzled.insert(bank_group_of_offset(tile_offset(row, chunk, s.chunks)));
            plain.insert(bank_group_of_offset((row * s.chunks + chunk) * kChunkElems));
          }
          if (swizzled.size() != 8) ++conflicts_swizzled;
          if (plain.size() != 8) ++conflicts_plain;
        }
      }
    INFO("operand layout " << static_cast<int>(op));
    CHECK(conflicts_swizzled == 0);
    // Without the swizzle the same pattern does conflict: the test has teeth.
    CHECK(conflicts_plain > 0);
  }
}

TEST_CASE("the tile loader copies every chunk once, conflict-free in shared memory", "[kernels][cuda-index]") {
  for (const auto [s, mn] : kShapes) {
    std::vector<int> hits(static_cast<size_t>(s.rows * s.chunks), 0);
    for (int pass = 0; pass < load_passes(mn); ++pass) {
      for (int t = 0; t < kThreads; ++t) {
        const ChunkPos p = load_chunk(t, pass, s.chunks);
        REQUIRE(p.row < s.rows);
        ++hits[static_cast<size_t>(p.row * s.chunks + p.chunk)];
      }
      // A 16-byte store is served 8 threads at a time: each group hits 8 bank groups.
      for (int t0 = 0; t0 < kThreads; t0 += 8) {
        std::set<int> groups;
        for (int t = t0; t < t0 + 8; ++t) {
          const ChunkPos p = load_chunk(t, pass, s.chunks);
          groups.insert(bank_group_of_offset(tile_offset(p.row, p.chunk, s.chunks)));
        }
        CHECK(groups.size() == 8);
      }
    }
    for (int h : hits) REQUIRE(h == 1);
  }
}

TEST_CASE("mma m16n8k16 fragments map every tile element to exactly one lane and register", "[kernels][cuda-index]") {
  std::vector<int> a(16 * 16, 0), b(16 * 8, 0), c(16 * 8, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        const Coord e = mma_a_element(lane, r, h);
        REQUIRE((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 16));
        ++a[static_cast<size_t>(e.row * 16 + e.col)];
      }
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) {
        const Coord e = mma_b_element(lane, r, h);  // (k, n)
        REQUIRE((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 8));
        ++b[static_cast<size_t>(e.row * 8 + e.col)];
      }
    for (int r = 0; r < 4; ++r) {
      const Coord e = mma_c_element(lane, r);
      REQUIRE((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 8));
      ++c[static_cast<size_t>(e.row * 8 + e.col)];
    }
  }
  for (int h : a) REQUIRE(h == 1);
  for (int h : b) REQUIRE(h == 1);
  for (int h : c) REQUIRE(h == 1);
}

TEST_CASE("ldmatrix from the swizzled tile delivers exactly the mma fragments", "[kernels][cuda-index]") {
  // A simulated shared-memory tile holding a logical operand with distinct values; each
  // lane's ldmatrix result must equal what mma.sync expects in that lane and register.
  for (Operand op : {Operand::AKMajor, Operand::AMMajor, Operand::BKMajor, Operand::BNMajor}) {
    const bool is_a = op == Operand::AKMajor || op == Operand::AMMajor;
    const TileShape s = operand_tile(k_major(op), extent(op));
    // logical(mn, k): the value of A[m][k] or B[k][n] (stored under the tile's layout).
    auto logical = [](int mn, int k) { return mn * 1000 + k; };
    std::vector<int> smem(static_cast<size_t>(extent(op) * kBK), -1);
    for (int r = 0; r < s.rows; ++r)
      for (int c = 0; c < s.chunks; ++c)
        for (int e = 0; e < kChunkElems; ++e) {
          const int mn = k_major(op) ? r : c * kChunkElems + e;
          const int k = k_major(op) ? c * kChunkElems + e : r;
          smem[static_cast<size_t>(tile_offset(r, c, s.chunks) + e)] = logical(mn, k);
        }
    int mismatches = 0;
    for (int mn = 0; mn < extent(op); mn += 16)
      for (int kk = 0; kk < kBK; kk += kMmaK) {
        const LdsmSource corner = block_corner(op, mn, kk);
        auto row_address = [&](int lane) {
          const LdsmSource src = source(op, lane);
          return tile_offset(corner.row + src.row, corner.chunk + src.chunk, s.chunks);
        };
        for (int lane = 0; lane < 32; ++lane)
          for (int j = 0; j < 4; ++j)  // register j comes from matrix j
            for (int h = 0; h < 2; ++h) {
              const Coord e = ldmatrix_element(lane, h, uses_trans(op));
              const int got = smem[static_cast<size_t>(row_address(8 * j + e.row) + e.col)];
              int want;
              if (is_a) {
                const Coord f = mma_a_element(lane, j, h);  // (m, k)
                want = logical(mn + f.row, kk + f.col);
              } else {
                const Coord f = mma_b_element(lane, j % 2, h);  // (k, n) of n8 tile j / 2
                want = logical(mn + 8 * (j / 2) + f.col, kk + f.row);
              }
              if (got != want) ++mismatches;
            }
      }
    INFO("operand layout " << static_cast<int>(op));
    CHECK(mismatches == 0);
  }
}

TEST_CASE("block tiles and the epilogue cover odd shapes exactly once", "[kernels][cuda-index]") {
  const int64_t sizes[] = {1, 7, 129, 1000};
  for (int64_t m : sizes)
    for (int64_t n : sizes) {
      std::vector<int> hits(static_cast<size_t>(m * n), 0);
      int64_t outside = 0;
      const int64_t tiles_m = ceil_div(m, kBM), tiles_n = ceil_div(n, kBN);
      for (int64_t y = 0; y < tiles_m; ++y)  // the launch's grid: (tiles_n, tiles_m)
        for (int64_t x = 0; x < tiles_n; ++x)
          for (int w = 0; w < kWarps; ++w)
            for (int mi = 0; mi < kWarpTilesM; ++mi)
              for (int ni = 0; ni < kWarpTilesN; ++ni)
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r) {
                    const BlockTile t = block_tile(x, y, tiles_n, tiles_m);
                    const Coord64 e = c_element(t.bm, t.bn, w, mi, ni, lane, r);
                    if (e.row < m && e.col < n)
                      ++hits[static_cast<size_t>(e.row * n + e.col)];
                    else
                      ++outside;
                  }
      INFO("M = " << m << ", N = " << n);
      for (int h : hits) REQUIRE(h == 1);
      CHECK(outside == ceil_div(m, kBM) * ceil_div(n, kBN) * kBM * kBN - m * n);

      std::vector<int> f32_hits(static_cast<size_t>(m * n), 0);
      for (int64_t bm = 0; bm < ceil_div(m, kF32Tile); ++bm)
        for (int64_t bn = 0; bn < ceil_div(n, kF32Tile); ++bn)
          for (int t = 0; t < kF32Threads; ++t)
            for (int i = 0; i < kF32Micro; ++i)
              for (int j = 0; j < kF32Micro; ++j) {
                const Coord64 e = f32_element(bm, bn, t, i, j);
                if (e.row < m && e.col < n) ++f32_hits[static_cast<size_t>(e.row * n + e.col)];
              }
      for (int h : f32_hits) REQUIRE(h == 1);
    }
}

TEST_CASE("k tiles load every k of odd lengths once and never read past a padded row", "[kernels][cuda-index]") {
  // The loader copies a chunk when it starts inside the row (k0 < K); rows are padded to
  // padded_ld(K) elements, so the chunk's elements past K are padding zeros, never the next
  // row. Modelled over the K-major A tile's k axis.
  for (int64_t k_len : {1, 7, 8, 129, 136, 1000}) {
    const int64_t ld = padded_ld(k_len);
    REQUIRE(ld % kChunkElems == 0);
    REQUIRE(ld >= k_len);
    REQUIRE(ld < k_len + kChunkElems);
    std::vector<int> hits(static_cast<size_t>(k_len), 0);
    const TileShape s = operand_tile(true, kBM);
    for (int64_t kt = 0; kt < ceil_div(k_len, kBK); ++kt)
      for (int pass = 0; pass < load_passes(kBM); ++pass)
        for (int t = 0; t < kThreads; ++t) {
          const ChunkPos p = load_chunk(t, pass, s.chunks);
          if (p.row != 0) continue;  // one row of the tile is enough for the k axis
          const int64_t k0 = kt * kBK + p.chunk * kChunkElems;
          if (k0 >= k_len) continue;  // zero-filled, nothing read
          REQUIRE(k0 + kChunkElems <= ld);
          for (int e = 0; e < kChunkElems; ++e)
            if (k0 + e < k_len) ++hits[static_cast<size_t>(k0 + e)];
        }
    INFO("K = " << k_len);
    for (int h : hits) REQUIRE(h == 1);
  }
}

TEST_CASE("the hoisted loader plan and ldmatrix offsets give the per-chunk formulas' addresses",
          "[kernels][cuda-index]") {
  // BELAY_GEMM_HOIST's kernel path: a thread's LoadPlan plus compile-time steps per pass is
  // load_chunk and tile_offset; a lane's fixed ldmatrix offset plus a constant step is
  // a_ldsm_offset / b_ldsm_offset, for every warp, tile and k step.
  int wrong = 0;
  for (const auto [s, mn] : kShapes) {
    const bool km = s.chunks == kBK / kChunkElems && s.rows == mn;
    for (int t = 0; t < kThreads; ++t) {
      const LoadPlan plan = load_plan(km, mn, t);
      for (int pass = 0; pass < load_passes(mn); ++pass) {
        const ChunkPos p = load_chunk(t, pass, s.chunks);
        wrong += p.row != plan.row + pass * load_row_step(km, mn) || p.chunk != plan.chunk;
        wrong += tile_offset(p.row, p.chunk, s.chunks) != plan.dst + pass * load_dst_step(km, mn);
      }
    }
  }
  for (bool km : {true, false})
    for (int lane = 0; lane < 32; ++lane)
      for (int kk = 0; kk < kBK; kk += kMmaK) {
        for (int wm = 0; wm < kBM; wm += kWarpM)
          for (int mi = 0; mi < kWarpTilesM; ++mi) {
            const int i = a_ldsm_index(km, mi, kk);
            REQUIRE((i >= 0 && i < kLdsmFixedA));
            wrong += a_ldsm_offset(km, lane, wm, mi, kk) != a_ldsm_fixed(km, lane, wm, i) + a_ldsm_step(km, mi, kk);
          }
        for (int wn = 0; wn < kBN; wn += kWarpN)
          for (int pair = 0; pair < kWarpTilesN / 2; ++pair) {
            const int i = b_ldsm_index(km, pair, kk);
            REQUIRE((i >= 0 && i < kLdsmFixedB));
            wrong += b_ldsm_offset(km, lane, wn, pair, kk) != b_ldsm_fixed(km, lane, wn, i) + b_ldsm_step(km, pair, kk);
          }
      }
  CHECK(wrong == 0);
}

TEST_CASE("block_tile maps the launch grid onto the tiles of C one to one", "[kernels][cuda-index]") {
  // Grids taller and shorter than a group, and a last group that is cut short.
  const int64_t extents[] = {1, 2, 7, 8, 9, 33, 64};
  for (int64_t tiles_m : extents)
    for (int64_t tiles_n : extents) {
      std::vector<int> hits(static_cast<size_t>(tiles_m * tiles_n), 0);
      for (int64_t y = 0; y < tiles_m; ++y)
        for (int64_t x = 0; x < tiles_n; ++x) {
          const BlockTile t = block_tile(x, y, tiles_n, tiles_m);
          REQUIRE((t.bm >= 0 && t.bm < tiles_m && t.bn >= 0 && t.bn < tiles_n));
          ++hits[static_cast<size_t>(t.bm * tiles_n + t.bn)];
        }
      INFO("tiles " << tiles_m << " x " << tiles_n << ", group " << kGroupM);
      for (int h : hits) REQUIRE(h == 1);
      // The first kGroupM * tiles_n blocks stay within kGroupM rows of tiles.
      for (int64_t id = 0; id < std::min(tiles_m * tiles_n, kGroupM * tiles_n); ++id)
        REQUIRE(block_tile(id % tiles_n, id / tiles_n, tiles_n, tiles_m).bm < kGroupM);
    }
}

TEST_CASE("a row kernel's grid covers every row once, at most kMaxRowBlocks blocks", "[kernels][cuda-index]") {
  using belay::cuda::kMaxRowBlocks;
  using belay::cuda::row_blocks;
  REQUIRE(row_blocks(1) == 1u);
  REQUIRE(row_blocks(kMaxRowBlocks) == static_cast<unsigned>(kMaxRowBlocks));
  REQUIRE(row_blocks(kMaxRowBlocks + 1) == static_cast<unsigned>(kMaxRowBlocks));
  REQUIRE(row_blocks(int64_t{1} << 40) == static_cast<unsigned>(kMaxRowBlocks));
  const int64_t tall[] = {1, 7, 256, kMaxRowBlocks, kMaxRowBlocks + 1, 3 * kMaxRowBlocks + 5};
  for (const int64_t rows : tall) {
    const int64_t grid = row_blocks(rows);
    std::vector<int> hits(static_cast<size_t>(rows), 0);
    for (int64_t block = 0; block < grid; ++block)  // the kernels' loop: r = blockIdx.x; r += gridDim.x
      for (int64_t r = block; r < rows; r += grid) ++hits[static_cast<size_t>(r)];
    INFO("rows = " << rows);
    REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
}
