// What the fused attention's two CPU implementations share (kernels/cpu/attention_kernels.cpp,
// FP32 tiles on every path; kernels/cpu/attention_bf16.cpp, BF16 pair products for BF16 on the
// amx and avx512bf16 paths): the causal mask, the per-row softmax steps on FP32 tiles, and the rows in and out.
// Both run one (item, query block) per forward task and one item per backward task.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/attention_tiles.h"

namespace belay::cpu::attention_parts {

constexpr int64_t kQueryRows = 32;  // query rows per block: a tile of scores is 8 KiB
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t key_tiles(int64_t tk) { return (tk + kAttnKeys - 1) / kAttnKeys; }

// Which keys a query sees: [0, visible(i)). Causal aligns the mask at the end of the keys, so
// query i of tq sees the keys up to i + tk - tq (a KV cache's new query sees them all).
struct Mask {
  bool causal;
  int64_t tq, tk;
  int64_t visible(int64_t i) const { return causal ? std::clamp<int64_t>(i + tk - tq + 1, 0, tk) : tk; }
  // The first query that sees key j.
  int64_t first_query(int64_t j) const { return causal ? std::max<int64_t>(0, j - (tk - tq)) : 0; }
};

// row[0, d) times factor into t's elements from `at`: straight into an FP32 t (no copy of the
// row through the buffer, 2.4% of the default GPT's attention at a head of 32), else scaled in
// place and rounded into t's dtype.
inline void store_scaled_row(float* row, int64_t d, float factor, Tensor& t, int64_t at) {
  float* dst = t.dtype() == DType::F32 ? t.data_as<float>() + at : row;
  for (int64_t c = 0; c < d; ++c) dst[c] = row[c] * factor;
  if (dst == row) store_block(t.data(), t.dtype(), at, d, row);
}

// The forward's last step for rows [i0, i0 + rows) of one item: o (rows of dp floats) divided
// by l into out, and lse = m + log l (a row that saw no key: out 0, lse -inf).
inline void finish_rows(float* o, int64_t dp, const float* m, const float* l, const AttentionDims& dims, int64_t item,
                        int64_t i0, int64_t rows, Tensor& out, Tensor& lse) {
  float* lse_out = lse.data_as<float>() + item * dims.tq + i0;
  for (int64_t r = 0; r < rows; ++r) {
    store_scaled_row(o + r * dp, dims.d, l[r] > 0.0f ? 1.0f / l[r] : 0.0f, out, dims.row_at(item, i0 + r, dims.tq));
    lse_out[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
  }
}

// D = rowsum(dO O) of one item's query rows, in FP32, each over the head dim in order. Eight
// rows at a time: each row's sum is one chain of d dependent adds, so a row at a time waited
// on the add's latency (the backward's own time was 9% of the default GPT's attention, most of
// it here); eight chains side by side overlap, each row's order unchanged.
inline void output_dots(const Tensor& out, const Tensor& dout, const AttentionDims& dims, int64_t item,
                        std::vector<float>& dsum) {
  constexpr int64_t kRows = 8;
  const int64_t d = dims.d;
  std::vector<float> gbuf(static_cast<size_t>(kRows * d)), obuf(gbuf.size());
  dsum.resize(static_cast<size_t>(dims.tq));
  for (int64_t i0 = 0; i0 < dims.tq; i0 += kRows) {
    const int64_t rows = std::min(kRows, dims.tq - i0);
    const float* g[kRows];
    const float* o[kRows];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = dims.row_at(item, i0 + r, dims.tq);
      g[r] = load_block(dout.data(), dout.dtype(), at, d, gbuf.data() + r * d);
      o[r] = load_block(out.data(), out.dtype(), at, d, obuf.data() + r * d);
    }
    for (int64_t r = rows; r < kRows; ++r) g[r] = o[r] = g[0];  // a short block's spare chains
    float acc[kRows] = {};
    for (int64_t c = 0; c < d; ++c)
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) acc[r] += g[r][c] * o[r][c];
    for (int64_t r = 0; r < rows; ++r) dsum[i0 + r] = acc[r];
  }
}

// P and dS of one block of query rows against one key tile: p = exp(scale s - lse) where the
// row sees the key (0 elsewhere), ds = p (dp - D). s and dpv hold the raw products on entry.
inline void probabilities_block(float* s, float* dpv, int64_t i0, int64_t rows, int64_t j0, int64_t keys, float scale,
                                const Mask& mask, const float* lse, const float* dsum, const AttentionTiles& t) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kAttnKeys;
    float* dr = dpv + r * kAttnKeys;
    const int64_t vis = std::clamp<int64_t>(mask.visible(i0 + r) - j0, 0, keys);
    if (vis > 0) {
      t.probabilities(sr, dr, vis, scale, lse[i0 + r], dsum[i0 + r]);
    } else {  // the row sees none of the tile
      std::fill(sr, sr + kAttnKeys, 0.0f);
      std::fill(dr, dr + kAttnKeys, 0.0f);
    }
  }
}

// rows [n, dp] of FP32 (times `factor`) into t's elements from `offset` as rows of d, ld apart.
inline void store_rows(float* rows, int64_t n, int64_t d, int64_t dp, float factor, Tensor& t, int64_t offset,
                       int64_t ld) {
  for (int64_t r = 0; r < n; ++r) store_scaled_row(rows + r * dp, d, factor, t, offset + r * ld);
}

}  // namespace belay::cpu::attention_parts
