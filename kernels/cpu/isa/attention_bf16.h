// The fused attention's products for BF16 q, k, v in pairs of k (BF16 operands, FP32 sums), one
// table per way of multiplying pairs: TDPBF16PS on AMX tiles (the amx path,
// kernels/cpu/isa/attention_amx.cpp, also built on the tile emulator of amx_tiles.h for baseline
// x86-64: the tests run it on any CPU) and VDPBF16PS (the avx512bf16 path,
// kernels/cpu/isa/attention_vdpbf16.cpp). kernels/cpu/attention_bf16.cpp runs either between
// the FP32 softmax steps of avx512's tiles (attention_tiles.h).
//
// Every product is C (+)= A B on whole 32 x 32 blocks: A is BF16 rows (k along a row), B is in
// pair panels of kBf16Block columns (32-bit words, the pair of k = 2p, 2p + 1 of one column;
// panels `ps` words apart: kernels/cpu/isa/pair_panels.h). The attention's operands reach
// those layouts once per item (pack_*) or, for P and dS, once per tile (round_*), by the same
// code in every table (kernels/cpu/isa/attention_pairs.h).
#pragma once
#include <cstdint>

namespace belay {

constexpr int64_t kBf16Block = 32;  // m, n and depth of every product are multiples of this

struct AttentionBf16 {
  // The tile configuration on the calling thread, before its first product; release after
  // (nothing to do for VDPBF16PS).
  void (*begin)();
  void (*end)();
  // x: n rows of d BF16 (row stride ldx). As B with k along x's rows (x^T: the keys of
  // S = Q K^T, dP = dO V^T): panel t holds rows [32 t, 32 t + 32), pair p = columns 2p, 2p + 1;
  // panels ps = 16 round_up(d, 32) words apart; rows past n up to `rows_to` are zero.
  void (*pack_rows)(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out);
  // As B with k down x's columns (x itself: V for P V, K for dS K): panel t holds columns
  // [32 t, 32 t + 32), pair p = rows 2p, 2p + 1, for p < rows_to / 2 (rows past n zero);
  // panels ps = 16 rows_to words apart.
  void (*pack_cols)(const uint16_t* x, int64_t ldx, int64_t n, int64_t d, int64_t rows_to, uint32_t* out);
  // c[m x n] (ldc floats) = (accumulate ? c : 0) + a[m x depth] (BF16, row stride lda) b. Each
  // output sums its pairs in order from c's old value; BF16 inputs below 2^-126 read as zero
  // and a subnormal sum is flushed to zero (both instructions, whatever MXCSR says).
  void (*product)(int64_t m, int64_t n, int64_t depth, const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ps,
                  float* c, int64_t ldc, bool accumulate);
  // rows x cols FP32 (row stride cols) rounded to BF16, to nearest even: as rows (an A
  // operand, row stride cols), and as pair panels of 32 columns with k down the rows (a B
  // operand; rows even), pair p of panel t at out[t * ps + 32 p].
  void (*round_rows)(const float* x, int64_t rows, int64_t cols, uint16_t* out);
  void (*round_pairs)(const float* x, int64_t rows, int64_t cols, int64_t ps, uint32_t* out);
  // out[c * rows + r] = x[r * cols + c]: rows x cols BF16 transposed (both multiples of 8).
  void (*transpose)(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* out);
};

namespace isa_amx { extern const AttentionBf16 attention_amx; }
namespace isa_amx_emulated { extern const AttentionBf16 attention_amx; }  // amx_tiles.h's emulator
namespace isa_avx512bf16 { extern const AttentionBf16 attention_vdpbf16; }

}  // namespace belay
