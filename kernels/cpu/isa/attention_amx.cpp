// The fused attention's BF16 products on AMX tiles (attention_amx.h), built for the amx copy
// (isa.cmake): packing into the tiles' layouts, the block products, and the rounding of P and
// dS to BF16. The products are amx_blocks.h's 32 x 32 microkernel, the GEMM's own: each
// output sums its k pairs in order (even product, then odd, amx_tiles.h), from C's old value.
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/attention_amx.cpp is built once per copy by isa.cmake"
#endif
#include "kernels/cpu/isa/attention_amx.h"

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/isa/amx_blocks.h"

namespace belay::BELAY_ISA_NS {
namespace {

static_assert(kAmxBlock == kBlock && kAmxBlock == kTileK, "the attention's blocks are the microkernel's");

int64_t up32(int64_t x) { return (x + kBlock - 1) / kBlock * kBlock; }
int clip(int64_t x) { return static_cast<int>(x < 0 ? 0 : x > kBlock ? kBlock : x); }

void begin() {
  const amx::TileConfig cfg = tile_config();
  amx::load_config(cfg);
}
void end() { amx::release(); }

void pack_rows(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out) {
  const View v{x, ldx, false};  // op(B) = x: element (row, column) along the row
  const int depth = static_cast<int>(up32(d));
  for (int64_t t = 0; t * kBlock < rows_to; ++t)
    pack_b_panel(v, t * kBlock, clip(n - t * kBlock), 0, static_cast<int>(d), depth, out + t * 16 * depth);
}

void pack_cols(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out) {
  const View v{x, ldx, true};  // op(B) = x^T: element (column, row), the rows adjacent
  for (int64_t t = 0; t * kBlock < d; ++t)
    pack_b_panel(v, t * kBlock, clip(d - t * kBlock), 0, static_cast<int>(n), static_cast<int>(rows_to),
                 out + t * 16 * rows_to);
}

void product(int64_t m, int64_t n, int64_t depth, const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ps,
             float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; i += kBlock)
    for (int64_t j = 0; j < n; j += kBlock)
      microkernel(static_cast<int>(depth), a + i * lda, lda, b + j / kBlock * ps, c + i * ldc + j, ldc, !accumulate);
}

// FP32 -> BF16 to nearest even, in the top half of a word (the low half zero); a NaN stays a
// (quiet) NaN. Integer operations on the bits: the loops below vectorize.
inline uint32_t bf16_high(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  return nan ? (b | 0x00400000u) & 0xffff0000u : rounded;
}

void round_rows(const float* x, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t i = 0; i < rows * cols; ++i) out[i] = static_cast<uint16_t>(bf16_high(x[i]) >> 16);
}

void round_pairs(const float* x, int64_t rows, int64_t cols, int64_t ps, uint32_t* out) {
  for (int64_t t = 0; t * kBlock < cols; ++t)
    for (int64_t p = 0; p < rows / 2; ++p) {
      const float* even = x + 2 * p * cols + t * kBlock;
      const float* odd = even + cols;
      uint32_t* o = out + t * ps + p * kBlock;
      for (int c = 0; c < kBlock; ++c) o[c] = bf16_high(even[c]) >> 16 | bf16_high(odd[c]);
    }
}

void transpose(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t r = 0; r < rows; r += 8)
    for (int64_t c = 0; c < cols; c += 8) transpose_8x8_u16(x + r * cols + c, cols, out + c * rows + r, rows);
}

}  // namespace

extern const AttentionAmx attention_amx = {begin,      end,         pack_rows, pack_cols,
                                           product,    round_rows,  round_pairs, transpose};

}  // namespace belay::BELAY_ISA_NS
