// The fused attention's products on AMX tiles (TDPBF16PS: BF16 operands, FP32 sums), for the
// amx path when q, k and v are BF16: kernels/cpu/attention_amx.cpp runs them, between the FP32
// softmax of avx512's tiles (attention_tiles.h). Built for the amx copy and, on the emulator of the tile
// instructions (amx_tiles.h), for baseline x86-64: the tests run the latter on any CPU (isa.cmake).
//
// Every product is C (+)= A B on whole 32 x 32 blocks (kernels/cpu/isa/amx_blocks.h): A is
// BF16 rows (k along a row), B is in pair panels of kAmxBlock columns (32-bit words, the pair
// of k = 2p, 2p + 1 of one column; panels `ps` words apart). The attention's operands reach
// those layouts once per item (pack_*) or, for P and dS, once per tile (round_*).
#pragma once
#include <cstdint>

namespace belay {

constexpr int64_t kAmxBlock = 32;  // m, n and depth of every product are multiples of this

struct AttentionAmx {
  // The tile configuration on the calling thread, before its first product; release after.
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
  // c[m x n] (ldc floats) = (accumulate ? c : 0) + a[m x depth] (BF16, row stride lda) b.
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

namespace isa_amx { extern const AttentionAmx attention_amx; }
namespace isa_amx_emulated { extern const AttentionAmx attention_amx; }  // amx_tiles.h's emulator

}  // namespace belay
