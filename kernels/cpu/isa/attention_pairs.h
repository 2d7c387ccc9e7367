// The fused attention's BF16 operands in the layouts of its pair products (attention_bf16.h): the
// packing of K, V (and Q, dO transposed) into pair panels, the rounding of P and dS to BF16,
// and the transpose. Written once for the two copies that multiply pairs: AMX tiles
// (attention_amx.cpp) and VDPBF16PS (attention_vdpbf16.cpp); each adds only its product.
// Included only by files built once per ISA.
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/attention_pairs.h belongs to a per-ISA copy (BELAY_ISA_NS)"
#endif
#if !defined(BELAY_HD)
#error "a per-ISA copy defines BELAY_HD static inline before engine/half_bits.h (its own copy of the rounding)"
#endif
#include <stdint.h>
#include <string.h>

#include "engine/half_bits.h"
#include "kernels/cpu/isa/attention_bf16.h"
#include "kernels/cpu/isa/pair_panels.h"

namespace belay::BELAY_ISA_NS::attention_pairs {

static_assert(kBf16Block == kBlock, "the attention's blocks are the panels' width");

inline int64_t up32(int64_t x) { return (x + kBlock - 1) / kBlock * kBlock; }
inline int clip(int64_t x) { return static_cast<int>(x < 0 ? 0 : x > kBlock ? kBlock : x); }

inline void pack_rows(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out) {
  const View v{x, ldx, false};  // op(B) = x: element (row, column) along the row
  const int depth = static_cast<int>(up32(d));
  for (int64_t t = 0; t * kBlock < rows_to; ++t)
    pack_b_panel(v, t * kBlock, clip(n - t * kBlock), 0, static_cast<int>(d), depth, out + t * 16 * depth);
}

inline void pack_cols(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out) {
  const View v{x, ldx, true};  // op(B) = x^T: element (column, row), the rows adjacent
  for (int64_t t = 0; t * kBlock < d; ++t)
    pack_b_panel(v, t * kBlock, clip(d - t * kBlock), 0, static_cast<int>(n), static_cast<int>(rows_to),
                 out + t * 16 * rows_to);
}

// FP32 -> BF16 to nearest even, in the top half of a word (the low half zero); a NaN stays a
// (quiet) NaN. Integer operations on the bits: the loops below vectorize.
inline uint32_t bf16_high(float f) { return static_cast<uint32_t>(f32_to_bf16_bits_select(f)) << 16; }

inline void round_rows(const float* x, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t i = 0; i < rows * cols; ++i) out[i] = static_cast<uint16_t>(bf16_high(x[i]) >> 16);
}

inline void round_pairs(const float* x, int64_t rows, int64_t cols, int64_t ps, uint32_t* out) {
  for (int64_t t = 0; t * kBlock < cols; ++t)
    for (int64_t p = 0; p < rows / 2; ++p) {
      const float* even = x + 2 * p * cols + t * kBlock;
      const float* odd = even + cols;
      uint32_t* o = out + t * ps + p * kBlock;
      for (int c = 0; c < kBlock; ++c) o[c] = bf16_high(even[c]) >> 16 | bf16_high(odd[c]);
    }
}

inline void transpose(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t r = 0; r < rows; r += 8)
    for (int64_t c = 0; c < cols; c += 8) transpose_8x8_u16(x + r * cols + c, cols, out + c * rows + r, rows);
}

// The table for a copy, given its product and its tile state's begin and end.
constexpr AttentionBf16 table(void (*begin)(), void (*end)(), decltype(AttentionBf16::product) product) {
  return {begin, end, pack_rows, pack_cols, product, round_rows, round_pairs, transpose};
}

}  // namespace belay::BELAY_ISA_NS::attention_pairs
