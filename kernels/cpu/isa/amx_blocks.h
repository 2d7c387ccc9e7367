// The 32 x 32 block product on AMX tiles, shared by the amx path's two users of TDPBF16PS: the
// GEMM (kernels/cpu/isa/gemm_amx.cpp, whose header comment explains the tiles and the layout) and
// the fused attention's BF16 products (kernels/cpu/isa/attention_amx.cpp). Its B operand is in
// the pair panels of kernels/cpu/isa/pair_panels.h (also VDPBF16PS's). Included only by files
// built once per ISA.
//
// A tile is 16 rows x 64 bytes: 16 x 16 FP32 of C, or 16 rows x 16 BF16 pairs of A or B.
// A tile of B is 16 pairs x 16 columns of a panel.
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/amx_blocks.h belongs to a per-ISA copy (BELAY_ISA_NS)"
#endif
#include <stdint.h>

#include "kernels/cpu/isa/amx_tiles.h"
#include "kernels/cpu/isa/pair_panels.h"

namespace belay::BELAY_ISA_NS {

static_assert(kBlock == 32, "the microkernel's C block: 2 x 2 tiles of 16 x 16");
constexpr int kTileK = 32;  // BF16 k per tile row (16 pairs)

// Every tile 16 rows x 64 bytes: C (0-3) 16 x 16 FP32, A (4, 5) 16 rows x 16 pairs, B (6, 7)
// 16 pairs x 16 columns. So each TDPBF16PS chains: C rows = A rows, A pairs = B rows.
inline amx::TileConfig tile_config() {
  amx::TileConfig cfg;
  for (int t = 0; t < amx::kTiles; ++t) {
    cfg.rows[t] = amx::kMaxRows;
    cfg.colsb[t] = amx::kMaxColsb;
  }
  return cfg;
}

// Where the microkernel finds the two A tiles of its 32 rows at k (rows 0-15 and 16-31, 32 k
// each), and their row stride in bytes. RowsA: A's rows as stored, row stride lda (the fused
// attention's operands). TiledA: a block packed in tile order (tiled_a_index, below), each tile
// 1 KiB in one run: the GEMM's packed A. A tile whose 16 rows lie a depth apart makes 16 streams
// for the prefetchers; one run is one. Measured on the AMX Xeon (2026-12-06, one thread, a
// packed 128 x 768 A block against 1024 packed B columns, both layouts alternated): 1107-1160
// against 1035-1069 GFLOP/s for the rows.
struct RowsA {
  const uint16_t* a;
  int64_t lda;
  const uint16_t* upper(int k) const { return a + k; }
  const uint16_t* lower(int k) const { return a + 16 * lda + k; }
  int64_t stride() const { return lda * 2; }
};
struct TiledA {
  const uint16_t* a;  // the block's 32 rows: [k / 32][32 rows][32 k]
  const uint16_t* upper(int k) const { return a + static_cast<int64_t>(k) * 32; }
  const uint16_t* lower(int k) const { return a + static_cast<int64_t>(k) * 32 + 16 * 32; }
  int64_t stride() const { return 64; }
};

// Element (r, k) of a tile-ordered A block of `depth` (a multiple of kTileK) k per row: the
// 32-row blocks one after another, each [k / 32][32 rows][32 k] (TiledA's layout).
inline int64_t tiled_a_index(int64_t r, int64_t k, int64_t depth) {
  return r / kBlock * (depth * kBlock) + k / kTileK * (kBlock * kTileK) + r % kBlock * kTileK + k % kTileK;
}

// C[0:32, 0:32] (ldc floats) = (overwrite ? 0 : C) + A's 32 rows (depth BF16 each, where `a`
// says) times the B panel (depth / 2 pairs x 32). Needs tile_config() loaded.
template <class A>
inline void microkernel_on(int depth, const A& a, const uint32_t* b, float* c, int64_t ldc, bool overwrite) {
  const int64_t c_stride = ldc * 4, a_stride = a.stride(), b_stride = kBlock * 4;
  if (overwrite) {
    amx::zero<0>();
    amx::zero<1>();
    amx::zero<2>();
    amx::zero<3>();
  } else {
    amx::load<0>(c, c_stride);
    amx::load<1>(c + 16, c_stride);
    amx::load<2>(c + 16 * ldc, c_stride);
    amx::load<3>(c + 16 * ldc + 16, c_stride);
  }
  for (int k = 0; k < depth; k += kTileK) {
    const uint32_t* bp = b + static_cast<int64_t>(k / 2) * kBlock;  // pair k / 2, column 0
    amx::load<4>(a.upper(k), a_stride);
    amx::load<5>(a.lower(k), a_stride);
    amx::load<6>(bp, b_stride);
    amx::load<7>(bp + 16, b_stride);
    amx::dot_bf16<0, 4, 6>();
    amx::dot_bf16<1, 4, 7>();
    amx::dot_bf16<2, 5, 6>();
    amx::dot_bf16<3, 5, 7>();
  }
  amx::store<0>(c, c_stride);
  amx::store<1>(c + 16, c_stride);
  amx::store<2>(c + 16 * ldc, c_stride);
  amx::store<3>(c + 16 * ldc + 16, c_stride);
}

// The same with A's rows as stored (row stride lda BF16): the fused attention's operands.
inline void microkernel(int depth, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
                        bool overwrite) {
  microkernel_on(depth, RowsA{a, lda}, b, c, ldc, overwrite);
}

}  // namespace belay::BELAY_ISA_NS
