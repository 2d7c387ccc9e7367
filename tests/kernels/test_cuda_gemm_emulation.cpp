// The tensor-core GEMM without a GPU: one block of gemm_tc_kernel run on the CPU through the
// very index functions the kernel calls (gemm_layout.h: which chunk each thread copies and
// from where, the swizzled stage offsets, the address each lane gives ldmatrix, where each
// accumulator lands in C), with ldmatrix and mma.sync.m16n8k16 emulated here from the PTX
// ISA's fragment tables. Every layout (trans_a x trans_b) and odd shapes (edges, K not a
// multiple of 8, so rows padded as launch_pad_rows pads them) must give the exact product of
// small integers; a stage element read before it was written would show as NaN, a chunk
// copied from past the operand fails a check.
//
// What this does not cover: the cp.async pipeline's waits and barriers (the k-tiles run one
// after another here), the PTX strings themselves, and the epilogue's dtype conversions.
// The SIMT emulator runs the kernel itself, pipeline and epilogue included
// (tests/gpu/test_cuda_gemm.cpp in the emulated build); the PTX strings only a GPU checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/half_bits.h"
#include "kernels/cuda/emulation/warp_matrix.h"
#include "kernels/cuda/gemm_layout.h"

using namespace belay;
using namespace belay::gemm;

namespace {

// A stored operand: `rows` rows of `ld` FP16 values (ld = padded_ld(cols), zero padded).
struct Stored {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<uint16_t> bits;
  float at(int64_t r, int64_t c) const { return f16_bits_to_f32(bits[static_cast<size_t>(r * ld + c)]); }
};

Stored make_operand(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-3, 3);
  Stored s{rows, cols, padded_ld(cols), {}};
  s.bits.assign(static_cast<size_t>(rows * s.ld), f32_to_f16_bits(0.0f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s.bits[static_cast<size_t>(r * s.ld + c)] = f32_to_f16_bits(float(value(rng)));
  return s;
}

constexpr uint16_t kUnwritten = 0x7e00;  // an FP16 NaN: a stage element no copy wrote

// load_tile: every thread, every pass, one 16-byte chunk copied or zero-filled, into a tile
// of extent mn (kBM for A, kBN for B).
void load_tile(bool k_major, int mn, const Stored& g, int mn_total, int k_total, int mn0, int k0, uint16_t* stage) {
  const int tile_elems = mn * kBK;
  std::vector<int> writes(tile_elems, 0);
  int bad_chunks = 0;
  for (int thread = 0; thread < kThreads; ++thread)
    for (int pass = 0; pass < load_passes(mn); ++pass) {
      const ChunkCopy c = tile_chunk_copy(k_major, mn, thread, pass, g.ld, mn_total, k_total, mn0, k0);
      const bool dst_ok = c.dst >= 0 && c.dst + kChunkElems <= tile_elems;
      // Never a byte from before or past the operand.
      const bool src_ok = !c.inside || (c.src >= 0 && c.src + kChunkElems <= static_cast<int64_t>(g.bits.size()));
      if (!dst_ok || !src_ok) {
        ++bad_chunks;
        continue;
      }
      for (int e = 0; e < kChunkElems; ++e) {
        stage[c.dst + e] = c.inside ? g.bits[static_cast<size_t>(c.src + e)] : f32_to_f16_bits(0.0f);
        ++writes[c.dst + e];
      }
    }
  REQUIRE(bad_chunks == 0);
  REQUIRE(std::count(writes.begin(), writes.end(), 1) == tile_elems);  // the tile is covered exactly once
}

// ldmatrix.x4 and mma.sync.m16n8k16 through the emulator's own fragment code
// (kernels/cuda/emulation/warp_matrix.h, from gemm_layout.h's PTX tables): the one
// implementation the SIMT emulator runs the real kernel with too. Values travel as floats
// here and as packed FP16 register halves there (exact for FP16 inputs).
void ldmatrix_x4(const uint16_t* stage, const int (&addr)[32], bool trans, float (&out)[32][4][2]) {
  const uint16_t* rows[32];
  for (int l = 0; l < 32; ++l) rows[l] = stage + addr[l];
  uint32_t regs[32][4];
  emu::ldmatrix_x4_fragments(rows, trans, regs);
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) out[l][j][h] = emu::fragment_half(regs[l][j], h, false);
}

uint32_t pack_f16(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_f16_bits(lo)) | (static_cast<uint32_t>(f32_to_f16_bits(hi)) << 16);
}

void mma_16816(float (&d)[32][4], const float (&a)[32][4][2], const float (&b)[32][2][2]) {
  uint32_t ar[32][4], br[32][2];
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r) ar[l][r] = pack_f16(a[l][r][0], a[l][r][1]);
    for (int r = 0; r < 2; ++r) br[l][r] = pack_f16(b[l][r][0], b[l][r][1]);
  }
  emu::mma_m16n8k16_fragments(ar, br, false, d);
}

// C (M x N, row-major) as the kernel computes it, block by block; `writes` counts the
// epilogue's stores per element.
void emulate_gemm(bool trans_a, bool trans_b, int m, int n, int k, const Stored& a, const Stored& b,
                  std::vector<float>& c, std::vector<int>& writes) {
  const bool a_kmajor = !trans_a, b_kmajor = trans_b;  // as launch_gemm_tensor_core decides
  std::vector<uint16_t> stage(kStageElems);
  uint16_t* a_s = stage.data();
  uint16_t* b_s = stage.data() + kATileElems;
  static float acc[kWarps][kWarpTilesM][kWarpTilesN][32][4];
  static float af[kWarpTilesM][32][4][2], bf[kWarpTilesN][32][2][2], r4[32][4][2];
  for (int bm = 0; bm < ceil_div(m, kBM); ++bm)
    for (int bn = 0; bn < ceil_div(n, kBN); ++bn) {
      for (auto& w : acc)
        for (auto& x : w)
          for (auto& y : x)
            for (auto& z : y)
              for (float& v : z) v = 0.0f;
      for (int kt = 0; kt < ceil_div(k, kBK); ++kt) {
        std::fill(stage.begin(), stage.end(), kUnwritten);
        load_tile(a_kmajor, kBM, a, m, k, bm * kBM, kt * kBK, a_s);
        load_tile(b_kmajor, kBN, b, n, k, bn * kBN, kt * kBK, b_s);
        for (int warp = 0; warp < kWarps; ++warp) {
          const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;
          for (int kk = 0; kk < kBK; kk += kMmaK) {
            int addr[32];
            for (int mi = 0; mi < kWarpTilesM; ++mi) {
              for (int lane = 0; lane < 32; ++lane) addr[lane] = a_ldsm_offset(a_kmajor, lane, wm, mi, kk);
              ldmatrix_x4(a_s, addr, !a_kmajor, af[mi]);
            }
            for (int pair = 0; pair < kWarpTilesN / 2; ++pair) {
              for (int lane = 0; lane < 32; ++lane) addr[lane] = b_ldsm_offset(b_kmajor, lane, wn, pair, kk);
              ldmatrix_x4(b_s, addr, !b_kmajor, r4);
              for (int l = 0; l < 32; ++l)
                for (int h = 0; h < 2; ++h) {  // registers 0, 1 -> tile 2 pair; 2, 3 -> tile 2 pair + 1
                  bf[2 * pair][l][0][h] = r4[l][0][h];
                  bf[2 * pair][l][1][h] = r4[l][1][h];
                  bf[2 * pair + 1][l][0][h] = r4[l][2][h];
                  bf[2 * pair + 1][l][1][h] = r4[l][3][h];
                }
            }
            for (int mi = 0; mi < kWarpTilesM; ++mi)
              for (int ni = 0; ni < kWarpTilesN; ++ni) mma_16816(acc[warp][mi][ni], af[mi], bf[ni]);
          }
        }
      }
      for (int warp = 0; warp < kWarps; ++warp)
        for (int mi = 0; mi < kWarpTilesM; ++mi)
          for (int ni = 0; ni < kWarpTilesN; ++ni)
            for (int lane = 0; lane < 32; ++lane)
              for (int r = 0; r < 4; ++r) {
                const Coord64 e = c_element(bm, bn, warp, mi, ni, lane, r);
                if (e.row < m && e.col < n) {
                  c[static_cast<size_t>(e.row * n + e.col)] = acc[warp][mi][ni][lane][r];
                  ++writes[static_cast<size_t>(e.row * n + e.col)];
                }
              }
    }
}

}  // namespace

TEST_CASE("tensor-core GEMM emulated on the CPU: every layout and odd shape gives the exact product",
          "[kernels][cuda-index]") {
  struct Problem {
    int m, n, k;
  };
  const Problem problems[] = {{1, 1, 1},    {7, 7, 7},     {129, 129, 129}, {1000, 129, 7},
                              {7, 1000, 129}, {129, 7, 300}, {136, 72, 200},  {130, 260, 65}};
  std::mt19937 rng(5);
  for (const Problem& p : problems)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true}) {
        CAPTURE(p.m, p.n, p.k, trans_a, trans_b);
        // Stored as the operands of C = op(A) op(B): A is [M, K] or, transposed, [K, M].
        const Stored a = trans_a ? make_operand(p.k, p.m, rng) : make_operand(p.m, p.k, rng);
        const Stored b = trans_b ? make_operand(p.n, p.k, rng) : make_operand(p.k, p.n, rng);
        std::vector<float> c(static_cast<size_t>(p.m) * p.n, NAN);
        std::vector<int> writes(c.size(), 0);
        emulate_gemm(trans_a, trans_b, p.m, p.n, p.k, a, b, c, writes);
        int wrong = 0, not_once = 0;
        for (int i = 0; i < p.m; ++i)
          for (int j = 0; j < p.n; ++j) {
            float want = 0.0f;  // small integers: every sum is exact in FP32
            for (int q = 0; q < p.k; ++q)
              want += (trans_a ? a.at(q, i) : a.at(i, q)) * (trans_b ? b.at(j, q) : b.at(q, j));
            wrong += c[static_cast<size_t>(i) * p.n + j] != want;  // NaN counts as wrong
            not_once += writes[static_cast<size_t>(i) * p.n + j] != 1;
          }
        CHECK(wrong == 0);
        CHECK(not_once == 0);
      }
}
