// The fused attention's inner products on one tile, once per vector ISA (attention_tiles.cpp,
// built by kernels/cpu/isa/isa.cmake with that path's flags): the only loops of
// kernels/cpu/attention_kernels.cpp that do O(T^2 d) work. Everything is FP32 here; the
// kernel file widens the operands once per item and rounds the results once.
//
// A tile is kAttnKeys keys wide. Rows of the FP32 operands are padded to a multiple of
// kAttnPad floats with zeros (the widest vector is 16 floats), so every loop over a row runs
// whole vectors and no path needs a remainder loop.
//
// Bits: every path sums each dot product and each accumulation in the same order (over the
// head dim c, or over the rows, one vector lane per output element), and a row's sum of
// probabilities in 16 fixed partial sums added in a fixed tree (adds only: the same on every path).
// exp is erf_exp.h's exp_f32, its multiply-adds fused as the products' are; arguments below -87 give 0 (see
// attention_tiles.cpp). The paths with FMA (avx2, avx512; avx512bf16 and amx run avx512's tiles) fuse each
// multiply-add, so they agree with each other bit for bit; baseline rounds the product first, so its bits differ from theirs by a rounding per
// term (the same bits on every run and thread count on each path). The BF16 attention of the
// amx and avx512bf16 paths (kernels/cpu/attention_bf16.cpp) uses only the softmax steps of
// avx512's tiles (online_softmax_rows, probabilities); its products run on BF16 pairs
// (attention_bf16.h).
#pragma once
#include <cstdint>

namespace belay {

constexpr int64_t kAttnKeys = 64;  // keys per tile (a multiple of every path's vector width)
constexpr int64_t kAttnPad = 16;   // FP32 rows are padded to a multiple of this many floats
constexpr int64_t kAttnMaxRows = 32;  // rows of one online_softmax_rows call, at most

struct AttentionTiles {
  // s[r * kAttnKeys + j] = sum over c < d of a[r * lda + c] * bt[c * ldb + j], for r < rows
  // and j < cols rounded up to whole vectors (the rest of each row of s left as it was): a row
  // block against a tile stored transposed ([d, keys], key j in column j). The scores q k^T
  // (bt = K^T) and the backward's dO v^T (bt = V^T); cols < kAttnKeys where the block sees
  // only the tile's first keys (causal).
  void (*dot_tile)(const float* a, int64_t lda, int64_t rows, const float* bt, int64_t ldb, int64_t d, int64_t cols,
                   float* s);
  // out[r * ldo + c] += sum over j < keys of w[r * kAttnKeys + j] * x[j * ldx + c], for
  // r < rows, c < dp (a multiple of kAttnPad): P V in the forward, dS K for dQ.
  void (*weigh_rows)(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                     int64_t ldo);
  // out[j * ldo + c] += sum over r < rows of w[r * kAttnKeys + j] * x[r * ldx + c], for
  // j < keys, c < dp: P^T dO for dV, dS^T Q for dK (the rows summed in order).
  void (*weigh_cols)(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                     int64_t ldo);
  // One query row's online softmax over one tile of its raw scores s (kAttnKeys of them, the
  // first `vis` > 0 seen): scaled, the rest masked; the running max *m and sum *l updated and the
  // row's output accumulator o (dp floats) rescaled by exp(old max - new max); s left holding
  // the tile's probabilities exp(scale s - new max) (0 where masked), for P V.
  void (*online_softmax)(float* s, int64_t vis, float scale, float* m, float* l, float* o, int64_t dp);
  // online_softmax on the `rows` rows of a block (row r: s + r kAttnKeys, its m[r], l[r] and
  // o + r ldo, vis[r] keys seen; 0: s's row zeroed, the rest untouched), each row's arithmetic
  // the same, the rows interleaved: their short serial steps (a maximum, a sum, the
  // correction's exp) overlap, and the corrections' exps run as one vector loop. Where a row's
  // correction is 1 its o is left as it is (o * 1 = o).
  void (*online_softmax_rows)(float* s, const int64_t* vis, int64_t rows, float scale, float* m, float* l, float* o,
                              int64_t ldo, int64_t dp);
  // The backward's row: s (raw scores) becomes P = exp(scale s - lse) for its first `vis` keys
  // (0 past them) and dp (dO.v) becomes dS = P (dp - dsum).
  void (*probabilities)(float* s, float* dp, int64_t vis, float scale, float lse, float dsum);
};

namespace isa_baseline { extern const AttentionTiles attention_tiles; }
namespace isa_avx2 { extern const AttentionTiles attention_tiles; }
namespace isa_avx512 { extern const AttentionTiles attention_tiles; }

}  // namespace belay
