// The fused attention's BF16 products on VDPBF16PS (attention_bf16.h), built for the avx512bf16
// copy only (isa.cmake): the path where a CPU has AVX512-BF16 but no AMX (AMD Zen 4 and 5), or
// where BELAY_CPU_ISA=avx512bf16 asks for it. The packing and the roundings are the AMX copy's
// (attention_pairs.h), so the two paths run the same products on the same operands, the same
// P and dS rounded to BF16; only the instruction differs.
//
// A product: for each panel of 32 output columns, kRows rows at a time held in registers
// (2 vectors of 16 FP32 each); per pair p, the panel's row p (2 vectors) is loaded once and
// each row's pair (k = 2p, 2p + 1 of A) broadcast as one 32-bit word. VDPBF16PS adds both
// products of the pair to each lane: the products exact (8-bit significands), the sums rounded
// to nearest even, a BF16 input below 2^-126 read as zero and a subnormal sum flushed to zero,
// whatever MXCSR says (Intel SDM) -- the AMX tiles' arithmetic, so the same bound holds
// (attention_check.h's `flush`); within a pair it adds the odd product first, the tiles the
// even one, so the two paths' bits may differ in the last place. Each output sums its pairs in
// order from C's old value: the same bits on every run and thread count.
//
// Flops: 2 m n depth per product; bytes: A and the B panel from L1 (the driver's blocks are 32
// rows by at most 128 deep), C loaded and stored once per product.
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/attention_vdpbf16.cpp is built once per copy by isa.cmake"
#endif
#if !defined(BELAY_ISA_avx512bf16)
#error "kernels/cpu/isa/attention_vdpbf16.cpp needs the avx512bf16 copy's flags"
#endif
#define BELAY_HD static inline  // engine/half_bits.h: this copy's own rounding (the one-definition rule)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/isa/attention_pairs.h"

namespace belay::BELAY_ISA_NS {
namespace {

// Rows per register block: 8 rows x 2 vectors = 16 accumulators, 2 for B, 1 for A's pair.
constexpr int kRows = 8;
static_assert(kBlock == 32 && kBf16Block % kRows == 0, "a panel is 2 vectors; a block is whole register blocks");

// c[kRows x 32] (ldc) = (accumulate ? c : 0) + a[kRows x depth] (BF16, row stride lda) times one
// panel (depth / 2 pairs x 32 columns, pair p at b + 32 p).
inline void rows_by_panel(int64_t depth, const uint16_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
                          bool accumulate) {
  __m512 acc[kRows][2];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < 2; ++h) acc[r][h] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * h) : _mm512_setzero_ps();
  for (int64_t p = 0; p < depth / 2; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kBlock));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kBlock + 16));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      uint32_t pair;
      memcpy(&pair, a + r * lda + 2 * p, 4);  // k = 2p (low half) and 2p + 1 (high half)
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < 2; ++h) _mm512_storeu_ps(c + r * ldc + 16 * h, acc[r][h]);
}

void product(int64_t m, int64_t n, int64_t depth, const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ps,
             float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < n; j += kBlock)
    for (int64_t i = 0; i < m; i += kRows)
      rows_by_panel(depth, a + i * lda, lda, b + j / kBlock * ps, c + i * ldc + j, ldc, accumulate);
}

void no_tile_state() {}  // VDPBF16PS works on ordinary vector registers

}  // namespace

extern const AttentionBf16 attention_vdpbf16 = attention_pairs::table(no_tile_state, no_tile_state, product);

}  // namespace belay::BELAY_ISA_NS
