// The pair-panel layout of a BF16 B operand, shared by the two ways the CPU multiplies BF16 pairs
// (TDPBF16PS on AMX tiles, kernels/cpu/isa/amx_blocks.h; VDPBF16PS on AVX512-BF16,
// kernels/cpu/isa/attention_vdpbf16.cpp): both add, per output, the products of one pair of k
// (2p, 2p + 1) at a time, so both read B as panels of kBlock columns, pair p of the kBlock columns
// at [p][kBlock] as one 32-bit word each (low half: k = 2p). Also an 8 x 8 transpose of 16-bit
// elements. SSE2, and AVX-512 where the copy is built for it (the amx and avx512bf16 copies: the
// transposition of column runs, the same words moved); included only by files built once per ISA.
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/pair_panels.h belongs to a per-ISA copy (BELAY_ISA_NS)"
#endif
#include <emmintrin.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace belay::BELAY_ISA_NS {

constexpr int kBlock = 32;  // a panel's columns (and the AMX microkernel's C block: 2 x 2 tiles of 16 x 16)

// A view of op(X) as R x K of BF16: element (r, k). `r_contiguous`: consecutive r are
// adjacent in memory (op(A) of a transposed A; op(B) of an untransposed B).
struct View {
  const uint16_t* data;
  int64_t ld;
  bool r_contiguous;
  int64_t at(int64_t r, int64_t k) const { return r_contiguous ? k * ld + r : r * ld + k; }
};

// dst[j * ld_dst + i] = src[i * ld_src + j] for an 8 x 8 block of 16-bit elements: three
// rounds of SSE2 unpacks (16-, 32-, 64-bit interleaves).
inline void transpose_8x8_u16(const uint16_t* src, int64_t ld_src, uint16_t* dst, int64_t ld_dst) {
  __m128i x[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ld_src));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm_unpacklo_epi16(x[2 * i], x[2 * i + 1]);      // columns 0-3 of rows 2i, 2i+1
    t[2 * i + 1] = _mm_unpackhi_epi16(x[2 * i], x[2 * i + 1]);  // columns 4-7
  }
  for (int h = 0; h < 2; ++h)    // rows 0-3, then 4-7
    for (int q = 0; q < 2; ++q) {  // columns 0-3, then 4-7
      u[4 * h + 2 * q] = _mm_unpacklo_epi32(t[4 * h + q], t[4 * h + 2 + q]);      // two columns
      u[4 * h + 2 * q + 1] = _mm_unpackhi_epi32(t[4 * h + q], t[4 * h + 2 + q]);  // the next two
    }
  for (int c = 0; c < 4; ++c) {  // u[c] holds columns 2c, 2c+1 of rows 0-3; u[4 + c] of rows 4-7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * c) * ld_dst), _mm_unpacklo_epi64(u[c], u[4 + c]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * c + 1) * ld_dst), _mm_unpackhi_epi64(u[c], u[4 + c]));
  }
}

#if defined(__AVX512F__)
// r[i] holds row i of a 16 x 16 block of 32-bit words; afterwards it holds column i: 32-bit,
// then 64-bit interleaves (each 128-bit lane then one column of 4 rows), then two rounds of
// 128-bit lane shuffles. 64 shuffles for 256 words, where 4 x 4 blocks take 128: the amx GEMM's
// forward products (B = W^T) took 0.96-0.98 of their time (2026-12-06, the AMX Xeon, alternated).
inline void transpose_16x16_u32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xDD);
  }
}

// The column runs' first p_end pairs (a multiple of 16) of a whole panel, 16 columns x 16 pairs
// at a time: col[c] is column c's run (its pairs as 32-bit words, any alignment).
inline void pack_column_runs_16(const uint16_t* const col[kBlock], int p_end, uint32_t* dst) {
  for (int c = 0; c < kBlock; c += 16)
    for (int p = 0; p < p_end; p += 16) {
      __m512i r[16];
      for (int q = 0; q < 16; ++q) r[q] = _mm512_loadu_si512(col[c + q] + 2 * p);
      transpose_16x16_u32(r);
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(dst + static_cast<int64_t>(p + q) * kBlock + c, r[q]);
    }
}
#endif

// The first `pairs` pairs of a whole panel whose k are runs of its 32 columns (columns
// [c0, c0 + 32) from k0): interleave the runs of k = 2p and 2p + 1 (SSE2 unpack: low halves
// from the first, high halves from the second). An AVX-512 form (16 columns zero-extended to
// words, the second shifted up) measured no faster on the AMX Xeon's dX and dW products.
inline void interleave_row_runs(const View& v, int64_t c0, int64_t k0, int pairs, uint32_t* dst) {
  for (int p = 0; p < pairs; ++p) {
    const uint16_t* lo = v.data + v.at(c0, k0 + 2 * p);
    const uint16_t* hi = v.data + v.at(c0, k0 + 2 * p + 1);
    uint32_t* d = dst + static_cast<int64_t>(p) * kBlock;
    for (int c = 0; c < kBlock; c += 8) {
      const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + c));
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + c), _mm_unpacklo_epi16(l, h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + c + 4), _mm_unpackhi_epi16(l, h));
    }
  }
}

// The pairs of a whole panel whose columns are runs along k (columns [c0, c0 + 32) from k0):
// each column's pairs are consecutive 32-bit words already, so the panel is that matrix of
// words transposed, 16 x 16 at a time in AVX-512 registers where the copy has them, the rest
// 4 x 4 through SSE registers. Returns how many pairs it wrote (whole groups of 4 within kc).
inline int transpose_column_runs(const View& v, int64_t c0, int64_t k0, int kc, uint32_t* dst) {
  const uint16_t* col[kBlock];
  for (int c = 0; c < kBlock; ++c) col[c] = v.data + v.at(c0 + c, k0);
  int p_wide = 0;
#if defined(__AVX512F__)
  p_wide = kc / 32 * 16;
  pack_column_runs_16(col, p_wide, dst);
#endif
  const int p_fast = kc / 8 * 4;
  for (int c = 0; c < kBlock; c += 4)
    for (int p = p_wide; p < p_fast; p += 4) {
      __m128 w0 = _mm_loadu_ps(reinterpret_cast<const float*>(col[c] + 2 * p));
      __m128 w1 = _mm_loadu_ps(reinterpret_cast<const float*>(col[c + 1] + 2 * p));
      __m128 w2 = _mm_loadu_ps(reinterpret_cast<const float*>(col[c + 2] + 2 * p));
      __m128 w3 = _mm_loadu_ps(reinterpret_cast<const float*>(col[c + 3] + 2 * p));
      _MM_TRANSPOSE4_PS(w0, w1, w2, w3);
      float* d = reinterpret_cast<float*>(dst + static_cast<int64_t>(p) * kBlock + c);
      _mm_storeu_ps(d, w0);
      _mm_storeu_ps(d + kBlock, w1);
      _mm_storeu_ps(d + 2 * kBlock, w2);
      _mm_storeu_ps(d + 3 * kBlock, w3);
    }
  return p_fast;
}

// Columns [c0, c0 + cols) x k [k0, k0 + kc) of op(B) as one panel of kBlock columns in pair
// layout: dst[p * kBlock + c] = k 2p in the low half, 2p + 1 in the high half, for
// p < depth / 2; columns past `cols` and k past kc are zero. A whole panel's whole pairs take
// one of the two fast ways above; the rest goes element by element.
inline void pack_b_panel(const View& v, int64_t c0, int cols, int64_t k0, int kc, int depth, uint32_t* dst) {
  int p_fast = 0;
  if (cols == kBlock && v.r_contiguous) {
    p_fast = kc / 2;
    interleave_row_runs(v, c0, k0, p_fast, dst);
  } else if (cols == kBlock) {
    p_fast = transpose_column_runs(v, c0, k0, kc, dst);
  }
  auto element = [&](int c, int k) -> uint32_t { return c < cols && k < kc ? v.data[v.at(c0 + c, k0 + k)] : 0u; };
  for (int p = p_fast; p < depth / 2; ++p)  // the edges, element by element
    for (int c = 0; c < kBlock; ++c)
      dst[static_cast<int64_t>(p) * kBlock + c] = element(c, 2 * p) | element(c, 2 * p + 1) << 16;
}

}  // namespace belay::BELAY_ISA_NS
