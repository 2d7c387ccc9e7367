// belay's own CPU matrix product, C (+)= op(A) op(B) (+ bias), compiled once per vector ISA
// (kernels/cpu/isa/isa.cmake: exactly that path's -m flags, BELAY_ISA_NS = isa_<path>).
//
// The classic packed design (Goto & van de Geijn; BLIS): for each block of KC rows of
// op(B) and NC of its columns, B is copied into contiguous panels NR columns wide (a
// transposed B a panel at a time, as the first block of A reaches it: see gemm_slice); for each
// block of MC rows of op(A), A into panels MR rows tall; then a register-resident MR x NR
// microkernel runs down the KC dimension, one FMA per (row, vector of columns, k). The
// packing is where the inputs' layout and dtype stop mattering: op() (transposed or not)
// and FP16/BF16 are read there, widened exactly to FP32, so every product, in every
// layout and dtype, runs the same microkernel on FP32 panels and accumulates in FP32.
// (One exception: on the avx512bf16 path a BF16 x BF16 product packs pairs of k and runs
// VDPBF16PS instead; see "BF16 pairs" below.)
//
// Summation order: for each output, the K products are summed in FP32 one KC block at a
// time (k ascending inside a block), each block's sum added to C. Accumulation (beta = 1)
// starts from the old C; the bias is added once, after the last block.
//
// Blocking: KC, MC and NC come from the caches read at start (kernels/cpu/gemm_blocking.h:
// what each level keeps where, and why only KC touches the bits).
//
// Threads: the larger of the M and N ranges is cut into one slice per OpenMP thread (in
// whole panels), and each thread packs and multiplies its slice alone: no barrier, no
// shared buffer. Packing buffers are per thread and kept (grown, never shrunk), so a
// training step allocates nothing here in steady state.
//
// One-definition rule (docs/toolchain.md): everything here is in BELAY_ISA_NS or an
// anonymous namespace, and the file includes nothing that instantiates a shared template
// or inline function (no std:: containers, no engine/half_bits.h): the FP16 conversion
// below is this file's own. tests/kernels/check_isa_objects.sh checks the object files.
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/gemm_packed.cpp is built once per ISA by isa.cmake"
#endif
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/isa/gemm_f32.h"
#include "kernels/cpu/isa/gemm_slices.h"

namespace belay::BELAY_ISA_NS {
namespace {

// ---- The vector of this path, and the shape of its microkernel ---------------------------
// MR x NR accumulators (NR = two vectors) stay in registers: AVX2 has 16 ymm, so 6 x 2 = 12
// accumulators + 2 B vectors + 1 broadcast; AVX-512 has 32 zmm: 12 x 2 = 24 + 3; SSE2 has
// 16 xmm: 6 x 2 + 3. kKCMax: the largest KC (the buffers' depth); gemm_blocking takes KC
// from the L1 size up to it (one B panel in half of L1d: 192 for AVX-512 with 48 KiB).
#if defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
using Vec = __m512;
constexpr int kW = 16, kMR = 12, kKCMax = 192;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_load_ps(p); }  // packed panels are 64-byte aligned
inline Vec vloadu(const float* p) { return _mm512_loadu_ps(p); }
inline void vstoreu(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
#elif defined(BELAY_ISA_avx2)
using Vec = __m256;
constexpr int kW = 8, kMR = 6, kKCMax = 256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_load_ps(p); }
inline Vec vloadu(const float* p) { return _mm256_loadu_ps(p); }
inline void vstoreu(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
#else  // baseline x86-64: SSE2, no FMA (a multiply, then an add: two roundings)
using Vec = __m128;
constexpr int kW = 4, kMR = 6, kKCMax = 256;
inline Vec vzero() { return _mm_setzero_ps(); }
inline Vec vload(const float* p) { return _mm_load_ps(p); }
inline Vec vloadu(const float* p) { return _mm_loadu_ps(p); }
inline void vstoreu(float* p, Vec v) { _mm_storeu_ps(p, v); }
inline Vec vbroadcast(const float* p) { return _mm_set1_ps(*p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
inline Vec vadd(Vec a, Vec b) { return _mm_add_ps(a, b); }
#endif
constexpr int kNV = 2;  // vectors across a tile
constexpr int kNR = kNV * kW;

// A micro-tile: MR rows of C by NV vectors of columns, MR x NV accumulators in registers, its
// A panels MR rows tall and its B panels NR = NV x kW columns wide. The path's own (Narrow,
// above) sets the blocking (KC from its B panel: kernels/cpu/gemm_blocking.h). AVX-512 also has
// a Wide tile, 8 x 48: per k 3 vector loads and 8 broadcasts for 24 FMAs, where 12 x 32 takes
// 2 and 12 (28 of the 32 zmm either way), and the A panel gives 32 bytes per k instead of 48;
// its B panel, 36 KiB at KC 192, still fits a 48 KiB L1d. On the AMX Xeon (1 thread, CPU
// time, the two tiles alternately, 2026-12-05) GPT-2 small's products took 0.955-1.04 of the
// 12 x 32 tile's time, median 0.97 (belay_bench --only gemm), and the default GPT's lost 5-15%
// where 48 does not divide N (N = 128, 512: the last panel computes columns for nothing), so a
// product takes it where N fills its panels (gemm_prefers_wide_tile). KC is the Narrow tile's on both, so are the bits: each output's
// K products are summed in the same order whatever tile computes it (tested).
template <int MR, int NV>
struct TileShape {
  static constexpr int kMR = MR, kNV = NV, kNR = NV * kW;
};
using Narrow = TileShape<kMR, kNV>;
#if defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
using Wide = TileShape<kGemmWideMr, kGemmWideNr / kW>;
static_assert(Wide::kNR == kGemmWideNr, "whole vectors");
#else
using Wide = Narrow;  // 16 vector registers: no room for a second shape
#endif
constexpr int kNRMax = Wide::kNR > Narrow::kNR ? Wide::kNR : Narrow::kNR;
// The blocking used when the caller gives none (GemmF32Args::blocking.kc == 0): the fixed
// one of before the caches were read. Measured on Zen 3 (AVX2, one thread, Linear(4096)
// products at batch 256): MC = 72 or 144 rows gave 0.64-0.77 of the FMA peak on the forward
// product, 288 rows 0.76-0.80; KC = 192 or 320 did no better than 256. A software prefetch of
// the A panel changed nothing.
constexpr int kMCDefault = 288;
constexpr int kNCDefault = 4096;
static_assert(kMCDefault % kMR == 0 && kNCDefault % kNR == 0, "blocks are whole panels");


// ---- Reading the inputs: any layout, any dtype, widened to FP32 --------------------------

// FP16 -> FP32, exact (every FP16 value is an FP32 value), NaN payloads kept.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);            // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);   // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;                                          // +-0
  } else {                                                // subnormal: normalise
    exp = 113u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// n consecutive elements of type t starting at element `at` of src, as FP32, into dst.
void widen_run(const void* src, GemmElem t, int64_t at, int n, float* dst) {
  if (t == GemmElem::F32) {
    memcpy(dst, static_cast<const float*>(src) + at, static_cast<size_t>(n) * 4);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src) + at;
  if (t == GemmElem::BF16) {
    // BF16 is FP32's top half: interleaving zeros below each 16-bit value (SSE2, every
    // path) widens eight at a time.
    int i = 0;
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_unpacklo_epi16(zero, h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 4), _mm_unpackhi_epi16(zero, h));
    }
    for (; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;  // BF16 is FP32's top half
      memcpy(dst + i, &bits, 4);
    }
    return;
  }
  int i = 0;
#if defined(BELAY_ISA_avx2) || defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
  // F16C, exact for every finite value and infinity; it quiets a signalling NaN, which can
  // only turn a NaN product into another NaN.
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

// A view of op(X) as R x K: element (r, k). `r_contiguous`: consecutive r are adjacent in
// memory (op(A) of a transposed A; op(B) of an untransposed B), else consecutive k are.
struct View {
  const void* data;
  GemmElem type;
  int64_t ld;  // the stored row length
  bool r_contiguous;
  int64_t at(int64_t r, int64_t k) const { return r_contiguous ? k * ld + r : r * ld + k; }
};

// P floats from src to d: whole vectors, then SSE quads. An A panel (MR = 6, 8 or 12) is not a
// multiple of the vector (4, 8, 16), and a vector past P would write into the next k's entries
// and, at the end of the block, past the buffer (ASan caught it in the bench's dW, M = 288).
template <int P>
inline void copy_entries(float* d, const float* src) {
  int r = 0;
  for (; r + kW <= P; r += kW) vstoreu(d + r, vloadu(src + r));
  for (; r + 4 <= P; r += 4) _mm_storeu_ps(d + r, _mm_loadu_ps(src + r));
  // MR = 6's last two as one 8-byte move (a movsd moves bits, whatever they are): two scalar
  // copies were a quarter of run_slices' samples in the default GPT's fp32 step on Zen 3.
  for (; r + 2 <= P; r += 2)
    _mm_store_sd(reinterpret_cast<double*>(d + r), _mm_load_sd(reinterpret_cast<const double*>(src + r)));
  for (; r < P; ++r) d[r] = src[r];
}

#if defined(BELAY_ISA_avx2) || defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
// Four floats from lo in the low half of a ymm, four from hi in the high half.
inline __m256 two_quads(const float* lo, const float* hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

// Eight rows (row[0..7]; `left`: the real rows from row[0] on, so the prefetch of row[8..15]
// reads only real ones) down k in [0, kc4) into dst[k * p + r]: rows 0..3 in the low halves and 4..7 in the high halves of four ymm, the 4 x 4
// transpose inside each half (the shuffles of one 4 x 4 move 8 values), one 32-byte store per
// k; the next eight rows prefetched. Measured on the AMX Xeon (1 thread, against the four-row
// SSE transposes alternately, GPT-2 small's forward products): 0.965-0.976 of the time at
// M = 128, 0.970-0.978 at 256, 0.984-0.988 at 1024 and 4096, where the pack of the transposed
// weight is spread over fewer rows.
inline void transpose_eight_rows(const float* const* row, int left, int kc4, float* dst, int p) {
  for (int k = 0; k < kc4; k += 4) {
    if (15 < left && (k & 15) == 0)
      for (int q = 8; q < 16; ++q) _mm_prefetch(reinterpret_cast<const char*>(row[q] + k), _MM_HINT_T0);
    const __m256 x0 = two_quads(row[0] + k, row[4] + k), x1 = two_quads(row[1] + k, row[5] + k);
    const __m256 x2 = two_quads(row[2] + k, row[6] + k), x3 = two_quads(row[3] + k, row[7] + k);
    const __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1);
    const __m256 t2 = _mm256_unpacklo_ps(x2, x3), t3 = _mm256_unpackhi_ps(x2, x3);
    float* d = dst + static_cast<int64_t>(k) * p;
    _mm256_storeu_ps(d, _mm256_shuffle_ps(t0, t2, 0x44));
    _mm256_storeu_ps(d + p, _mm256_shuffle_ps(t0, t2, 0xEE));
    _mm256_storeu_ps(d + 2 * p, _mm256_shuffle_ps(t1, t3, 0x44));
    _mm256_storeu_ps(d + 3 * p, _mm256_shuffle_ps(t1, t3, 0xEE));
  }
}
#endif

// Four rows the same way through one 4 x 4 SSE transpose per 4 k (every path has SSE); the
// rows 8 ahead prefetched a line at a time (DRAM-bound case, Zen 5: 0.28 -> 0.23 ns a value).
inline void transpose_four_rows(const float* const* row, int left, int kc4, float* dst, int p) {
  for (int k = 0; k < kc4; k += 4) {
    if (11 < left && (k & 15) == 0)
      for (int q = 8; q < 12; ++q) _mm_prefetch(reinterpret_cast<const char*>(row[q] + k), _MM_HINT_T0);
    __m128 x0 = _mm_loadu_ps(row[0] + k), x1 = _mm_loadu_ps(row[1] + k);
    __m128 x2 = _mm_loadu_ps(row[2] + k), x3 = _mm_loadu_ps(row[3] + k);
    _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
    float* d = dst + static_cast<int64_t>(k) * p;
    _mm_storeu_ps(d, x0);
    _mm_storeu_ps(d + p, x1);
    _mm_storeu_ps(d + 2 * p, x2);
    _mm_storeu_ps(d + 3 * p, x3);
  }
}

// Two rows (MR = 6's rows 4 and 5) through one unpack pair per 4 k, each k's two values one
// 8-byte store. They went one value at a time, 8 scalar loads and 8 scalar stores per 4 k: about
// a sixth of run_slices' samples in the default GPT's fp32 step on Zen 3 (the K = 128 forward and
// dX products transpose A for every block).
inline void transpose_two_rows(const float* const* row, int kc4, float* dst, int p) {
  for (int k = 0; k < kc4; k += 4) {
    const __m128 x0 = _mm_loadu_ps(row[0] + k), x1 = _mm_loadu_ps(row[1] + k);
    const __m128 lo = _mm_unpacklo_ps(x0, x1), hi = _mm_unpackhi_ps(x0, x1);  // k, k + 1 | k + 2, k + 3
    float* d = dst + static_cast<int64_t>(k) * p;
    _mm_storel_pi(reinterpret_cast<__m64*>(d), lo);
    _mm_storeh_pi(reinterpret_cast<__m64*>(d + p), lo);
    _mm_storel_pi(reinterpret_cast<__m64*>(d + 2 * p), hi);
    _mm_storeh_pi(reinterpret_cast<__m64*>(d + 3 * p), hi);
  }
}

// Packs rows [r0, r0 + rows) x k in [k0, k0 + kc) of v as one panel P rows tall:
// dst[k * P + r], rows past `rows` zero (so edge tiles run the full microkernel).
// `scratch` holds P x kKCMax floats.
template <int P>
void pack_panel(const View& v, int64_t r0, int rows, int64_t k0, int kc, float* dst, float* scratch) {
  if (v.r_contiguous) {  // each k is a contiguous run of the panel's rows
    for (int k = 0; k < kc; ++k) {
      float* d = dst + static_cast<int64_t>(k) * P;
      const int64_t at = v.at(r0, k0 + k);
      if (v.type == GemmElem::F32 && rows == P) {
        copy_entries<P>(d, static_cast<const float*>(v.data) + at);
        continue;
      }
      widen_run(v.data, v.type, at, rows, d);
      for (int r = rows; r < P; ++r) d[r] = 0.0f;
    }
    return;
  }
  // Each row is a contiguous run along k: read FP32 rows in place (others widened into
  // scratch first), then transpose 4 x 4 blocks (SSE registers, or two to a ymm with AVX) into
  // the panel; rows past `rows` read zeros.
  alignas(64) static const float zeros[kKCMax] = {};
  const float* row[P];
  for (int r = 0; r < P; ++r) {
    if (r >= rows) {
      row[r] = zeros;
    } else if (v.type == GemmElem::F32) {
      row[r] = static_cast<const float*>(v.data) + v.at(r0 + r, k0);
    } else {
      widen_run(v.data, v.type, v.at(r0 + r, k0), kc, scratch + r * kKCMax);
      row[r] = scratch + r * kKCMax;
    }
  }
  // Eight or four rows at a time down the whole of kc, not four k across all P rows: the rows of a
  // transposed weight are often a power of two apart (16 KB for K = 4096), so P rows fall
  // in one L1 set, and sweeping all of them per 4 k evicted each line before its next use
  // (Zen 5, K = 4096: 0.33 -> 0.27 ns per element, 0.20 -> 0.09 when the source is in L2).
  const int kc4 = kc / 4 * 4;
  int done = 0;
#if defined(BELAY_ISA_avx2) || defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
  for (; done + 8 <= P; done += 8) transpose_eight_rows(row + done, rows - done, kc4, dst + done, P);
#endif
  for (; done + 4 <= P; done += 4) transpose_four_rows(row + done, rows - done, kc4, dst + done, P);
  for (; done + 2 <= P; done += 2) transpose_two_rows(row + done, kc4, dst + done, P);  // MR = 6: rows 4 and 5
  static_assert(P % 2 == 0, "panels come in whole row pairs");
  for (int k = kc4; k < kc; ++k)
    for (int r = 0; r < P; ++r) dst[static_cast<int64_t>(k) * P + r] = row[r][k];
}

// ---- The microkernel -------------------------------------------------------------------
// C's tile is read (or written) only after the k loop: ask for its lines now, so they arrive
// while the FMAs run instead of stalling the stores.
// Each row's first and last float, and a float every line between (the Wide tile's rows span 3).
template <class T>
inline void prefetch_tile(const float* c, int64_t ldc, int rows) {
  for (int i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    for (int j = 16; j + 16 < T::kNR; j += 16) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + j), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + T::kNR - 1), _MM_HINT_T0);
  }
}

// C[0:MR, 0:NR] (ldc) = (overwrite ? 0 : C) + acc (+ bias[j] when given): the accumulators
// of one microkernel call. `rows` x `cols` of the tile are real; a partial tile goes
// through a local buffer.
template <class T, int MR>
inline void store_tile(Vec (&acc)[MR][T::kNV], float* __restrict c, int64_t ldc, int rows, int cols, bool overwrite,
                       const float* bias) {
  constexpr int kNR = T::kNR;
  const bool full = rows == MR && cols == kNR;
  alignas(64) float tile[MR * kNR];
  float* out = full ? c : tile;
  const int64_t ld = full ? ldc : kNR;
  if (!full) memset(tile, 0, sizeof tile);  // the lanes past the edge: computed, never stored
  if (!full && !overwrite)
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) tile[i * kNR + j] = c[i * ldc + j];
  alignas(64) float bias_row[kNR];
  if (bias && !full) {
    for (int j = 0; j < kNR; ++j) bias_row[j] = j < cols ? bias[j] : 0.0f;
    bias = bias_row;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* row = out + i * ld;
#pragma GCC unroll 4
    for (int v = 0; v < T::kNV; ++v) {
      Vec x = acc[i][v];
      if (!overwrite) x = vadd(vloadu(row + v * kW), x);
      if (bias) x = vadd(x, vloadu(bias + v * kW));
      vstoreu(row + v * kW, x);
    }
  }
  if (!full)
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) c[i * ldc + j] = tile[i * kNR + j];
}

// The multiply-add of one panel entry (one k) on FP32 panels: FMA (SSE2: multiply, add).
struct F32Step {
  using Entry = float;
  using Operand = Vec;
  static Operand load_b(const float* b) { return vload(b); }
  static Operand broadcast_a(const float* a) { return vbroadcast(a); }
  static Vec multiply_add(Vec acc, Operand a, Operand b) { return vfma(a, b, acc); }
};

// Memory a microkernel call prefetches while it runs: `rows` runs of `lines` cache lines, the
// first line of run r at first + r * stride bytes. None (rows = 0) for most calls.
struct Ahead {
  const char* first = nullptr;
  int64_t stride = 0;
  int rows = 0, lines = 0;
};

// C[0:MR, 0:NR] (ldc) = (overwrite ? 0 : C) + sum over the `depth` panel entries of
// a[entry][i] * b[entry][j] (+ bias[j] when given), one Step per entry, on tile T. The A panel
// is T::kMR rows tall whatever MR is: a short edge tile (MR < T::kMR) reads only its first MR rows.
// The lines of `ahead` are prefetched one every few k, among the FMAs: the same prefetches as
// a burst before the call stalled the thread (each row of a weight is a new page, so a
// prefetch can wait on a table walk, and few misses fit in flight) about as long as they
// saved in the pack. PREFETCHT0 left the pack a little less to wait for than T1 or T2 (Zen 5,
// the forward product: its share of the samples 0.38-0.41 of the old pack's, T1 0.49).
template <class Step, class T, int MR>
void microkernel(int depth, const typename Step::Entry* __restrict a, const typename Step::Entry* __restrict b,
                 float* __restrict c, int64_t ldc, int rows, int cols, bool overwrite, const float* bias,
                 const Ahead& ahead) {
  constexpr int kNV = T::kNV;
  prefetch_tile<T>(c, ldc, rows);
  int left = ahead.rows * ahead.lines, line = 0, countdown = 0;
  const int every = left > 0 && depth > left ? depth / left : 1;
  const char* run = ahead.first;
  Vec acc[MR][kNV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[i][v] = vzero();
  for (int k = 0; k < depth; ++k) {
    if (left > 0 && --countdown <= 0) {
      countdown = every;
      _mm_prefetch(run + line * 64, _MM_HINT_T0);
      if (++line == ahead.lines) line = 0, run += ahead.stride;
      --left;
    }
    typename Step::Operand bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = Step::load_b(b + v * kW);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const typename Step::Operand ai = Step::broadcast_a(a + i);
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = Step::multiply_add(acc[i][v], ai, bv[v]);
    }
    a += T::kMR;
    b += T::kNR;
  }
  for (; left > 0; --left) {  // more lines than k: the rest now
    _mm_prefetch(run + line * 64, _MM_HINT_T0);
    if (++line == ahead.lines) line = 0, run += ahead.stride;
  }
  store_tile<T, MR>(acc, c, ldc, rows, cols, overwrite, bias);
}

// One tile of `rows` (1..T::kMR) rows: the microkernel with the fewest rows of accumulators,
// in thirds of kMR (halves for the Wide tile's 8), that covers them. An edge tile of M = 256
// has 4 rows (256 = 21 x 12 + 4 on avx512): the full 12-row kernel spent 12 rows' FMAs on it,
// 3% of the product; the 4-row one keeps 8 accumulators, enough to cover the FMA latency on
// both ports (avx2 and baseline: 2, 4 or 6 rows). Each output is summed exactly as in the tall
// kernel.
template <class Step, class T>
void run_tile(int depth, const typename Step::Entry* a, const typename Step::Entry* b, float* c, int64_t ldc,
              int rows, int cols, bool overwrite, const float* bias, const Ahead& ahead) {
  constexpr int kParts = T::kMR % 3 == 0 ? 3 : 2;
  static_assert(T::kMR % kParts == 0, "edge tiles come in thirds or halves of MR");
  if (rows <= T::kMR / kParts)
    microkernel<Step, T, T::kMR / kParts>(depth, a, b, c, ldc, rows, cols, overwrite, bias, ahead);
  else if (kParts == 3 && rows <= 2 * T::kMR / kParts)
    microkernel<Step, T, 2 * T::kMR / kParts>(depth, a, b, c, ldc, rows, cols, overwrite, bias, ahead);
  else
    microkernel<Step, T, T::kMR>(depth, a, b, c, ldc, rows, cols, overwrite, bias, ahead);
}

// Packs rows [r0, r0 + n) x k in [k0, k0 + kc) of v as panels P rows tall, one after another
// (op(B)'s KC x NC block as NR-wide panels, op(A)'s MC x KC block as MR-tall ones). An FP32 view
// whose rows are adjacent in memory (an untransposed B; a transposed A, dY^T in the dW product)
// is read a k at a time across all the full panels, one contiguous run of n floats per k, not
// P floats from each of kc stored rows per panel: a weight matrix is far larger than the caches,
// and for dY^T the panel by panel order was a stream per k the hardware prefetcher did not follow
// (run_slices 7.8% -> 7.2% of the default GPT's fp32 step on Zen 4).
template <int P>
void pack_block(const View& v, int64_t r0, int64_t n, int64_t k0, int kc, float* dst, float* scratch) {
  const int64_t full = v.r_contiguous && v.type == GemmElem::F32 ? n / P * P : 0;
  for (int k = 0; k < kc && full > 0; ++k) {
    const float* src = static_cast<const float*>(v.data) + v.at(r0, k0 + k);
    for (int64_t r = 0; r < full; r += P) copy_entries<P>(dst + r * kc + static_cast<int64_t>(k) * P, src + r);
  }
  for (int64_t r = full; r < n; r += P)
    pack_panel<P>(v, r0 + r, static_cast<int>(min64(P, n - r)), k0, kc, dst + r * kc, scratch);
}

// ---- BF16 pairs: VDPBF16PS (the avx512bf16 path) ----------------------------------------
// When both inputs are BF16 and the CPU has AVX512-BF16, the panels hold pairs of
// consecutive k as one 32-bit word (element 2p in the low half, 2p + 1 in the high half) and
// VDPBF16PS does 16 lanes x 2 k per instruction: twice the FP32 FMA's work per instruction
// (measured on the Zen 5 of 2026-12-01: 174-178 vs 87-89 GFLOP/s on one core).
// It rounds differently from the FP32 path (Intel SDM, VDPBF16PS): each lane adds the odd
// product and then the even one, the products exact (8-bit significands), the sums rounded
// to nearest even; BF16 inputs below 2^-126 (subnormals) read as zero and a subnormal
// result is flushed to zero whatever MXCSR says. Order and flushing aside it is the same
// FP32 sum, so the tests hold it to the same bound on the FP64 reference, and one test
// shows the flush. An odd K gets a zero high half in its last pair, in both panels.
#if defined(BELAY_ISA_avx512bf16)
constexpr int kKP = kKCMax;  // the most pairs per K block: 2 x 192 k, the FP32 panels' bytes

// Packs rows [r0, r0 + rows) x k in [k0, k0 + kc) of a BF16 view as one panel P rows tall:
// dst[p * P + r] = the pair (2p, 2p + 1) of row r; rows past `rows` and the high half past
// kc are zero.
template <int P>
void pack_pairs(const View& v, int64_t r0, int rows, int64_t k0, int kc, uint32_t* dst) {
  const uint16_t* x = static_cast<const uint16_t*>(v.data);
  const int kp = (kc + 1) / 2, full_pairs = kc / 2;
  if (v.r_contiguous) {
    // Each k is a run of the panel's rows: two runs zero-extended to 32 bits, the second
    // shifted into the high halves. Masked loads: rows past the edge read nothing.
    for (int p = 0; p < kp; ++p) {
      const uint16_t* lo = x + v.at(r0, k0 + 2 * p);
      const uint16_t* hi = 2 * p + 1 < kc ? x + v.at(r0, k0 + 2 * p + 1) : nullptr;
      for (int r = 0; r < P; r += 16) {
        const int n = rows - r < 16 ? (rows - r > 0 ? rows - r : 0) : 16;
        const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
        const __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + r));
        const __m512i h = hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + r)) : _mm512_setzero_si512();
        const __m512i w = _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
        const int room = P - r < 16 ? P - r : 16;  // P = 12: the panel ends inside the vector
        _mm512_mask_storeu_epi32(dst + p * P + r, static_cast<__mmask16>((1u << room) - 1u), w);
      }
    }
    return;
  }
  // Each row is a run along k, so a pair is one 32-bit word in memory already: the panel is
  // that matrix of words transposed, 4 x 4 at a time through SSE registers (bit moves only).
  alignas(64) static const uint16_t zeros[2 * kKP + 8] = {};
  const uint16_t* row[P];
  for (int r = 0; r < P; ++r) row[r] = r < rows ? x + v.at(r0 + r, k0) : zeros;
  // Four rows down all the pairs at a time, as pack_panel does (and for the same reason).
  const int pairs4 = full_pairs / 4 * 4;
  for (int r = 0; r < P; r += 4) {
    for (int p = 0; p < pairs4; p += 4) {
      if (r + 11 < rows && (p & 15) == 0)
        for (int q = 8; q < 12; ++q) _mm_prefetch(reinterpret_cast<const char*>(row[r + q] + 2 * p), _MM_HINT_T0);
      __m128 w0 = _mm_loadu_ps(reinterpret_cast<const float*>(row[r] + 2 * p));
      __m128 w1 = _mm_loadu_ps(reinterpret_cast<const float*>(row[r + 1] + 2 * p));
      __m128 w2 = _mm_loadu_ps(reinterpret_cast<const float*>(row[r + 2] + 2 * p));
      __m128 w3 = _mm_loadu_ps(reinterpret_cast<const float*>(row[r + 3] + 2 * p));
      _MM_TRANSPOSE4_PS(w0, w1, w2, w3);
      float* d = reinterpret_cast<float*>(dst + p * P + r);
      _mm_storeu_ps(d, w0);
      _mm_storeu_ps(d + P, w1);
      _mm_storeu_ps(d + 2 * P, w2);
      _mm_storeu_ps(d + 3 * P, w3);
    }
  }
  for (int p = pairs4; p < kp; ++p)
    for (int r = 0; r < P; ++r) {
      const uint32_t lo = row[r][2 * p], hi = 2 * p + 1 < kc ? row[r][2 * p + 1] : 0u;
      dst[p * P + r] = lo | hi << 16;
    }
}

static_assert(kMR % 4 == 0 && kNR % 16 == 0, "the pair packing moves 4 rows and 16 columns at a time");

// The KC x NC block of op(B) as NR-wide pair panels. An untransposed B goes k pair by k pair
// across all panels (two contiguous runs of nc per pair), as the FP32 packing does.
void pack_b_pairs(const View& bv, int64_t jc, int64_t nc, int64_t pc, int kc, uint32_t* dst) {
  const int kp = (kc + 1) / 2;
  if (bv.r_contiguous) {
    const uint16_t* x = static_cast<const uint16_t*>(bv.data);
    const int64_t full = nc / kNR * kNR;
    for (int p = 0; p < kp; ++p) {
      const uint16_t* lo = x + bv.at(jc, pc + 2 * p);
      const uint16_t* hi = 2 * p + 1 < kc ? x + bv.at(jc, pc + 2 * p + 1) : nullptr;
      for (int64_t jr = 0; jr < full; jr += kNR) {
        uint32_t* d = dst + jr * kp + static_cast<int64_t>(p) * kNR;
        for (int r = 0; r < kNR; r += 16) {
          const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + jr + r)));
          const __m512i h = hi ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + jr + r)))
                               : _mm512_setzero_si512();
          _mm512_storeu_si512(d + r, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
        }
      }
    }
    if (full < nc) pack_pairs<kNR>(bv, jc + full, static_cast<int>(nc - full), pc, kc, dst + full * kp);
    return;
  }
  for (int64_t jr = 0; jr < nc; jr += kNR)
    pack_pairs<kNR>(bv, jc + jr, static_cast<int>(min64(kNR, nc - jr)), pc, kc, dst + jr * kp);
}

// One pair entry: VDPBF16PS adds both of the pair's products to each lane.
struct PairStep {
  using Entry = uint32_t;
  using Operand = __m512bh;
  static Operand load_b(const uint32_t* b) { return reinterpret_cast<__m512bh>(_mm512_load_si512(b)); }
  static Operand broadcast_a(const uint32_t* a) {
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(*a)));
  }
  static Vec multiply_add(Vec acc, Operand a, Operand b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#endif  // BELAY_ISA_avx512bf16

// ---- Per-thread packing buffers, kept between calls ----------------------------------------
struct Buffers {
  float* a = nullptr;  // MC x KC
  float* b = nullptr;  // KC x NC
  float* scratch = nullptr;  // kNRMax x kKCMax: rows widened before a transposing pack
  size_t a_size = 0, b_size = 0;  // floats
};
thread_local Buffers tls_buffers;

float* aligned_floats(size_t n) {
  void* p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
  if (!p) abort();  // the product cannot run without them; a few MB per thread
  return static_cast<float*>(p);
}

// This thread's buffers, grown (never shrunk) to the blocking's sizes.
Buffers& buffers(const GemmBlocking& bl) {
  Buffers& b = tls_buffers;
  const size_t a_size = static_cast<size_t>(bl.mc) * bl.kc;
  const size_t b_size = static_cast<size_t>(bl.kc) * bl.nc;
  if (b.a_size < a_size) {
    free(b.a);
    b.a = aligned_floats(a_size);
    b.a_size = a_size;
  }
  if (b.b_size < b_size) {
    free(b.b);
    b.b = aligned_floats(b_size);
    b.b_size = b_size;
  }
  if (!b.scratch) b.scratch = aligned_floats(static_cast<size_t>(kNRMax) * kKCMax);
  return b;
}

GemmBlocking default_blocking() { return GemmBlocking{kMR, kNR, kKCMax, kMCDefault, kNCDefault}; }

// The caller's blocking if it fits this path (whole panels, KC within the buffers' depth),
// else the default.
GemmBlocking checked_blocking(const GemmBlocking& b) {
  const bool ok = b.mr == kMR && b.nr == kNR && b.kc >= 1 && b.kc <= kKCMax && b.mc >= kMR && b.mc % kMR == 0 &&
                  b.nc >= kNR && b.nc % kNR == 0;
  return ok ? b : default_blocking();
}


// Rows [lo, hi) of a panel of a k-contiguous view (its rows from r0, k in [k0, k0 + kc)) as
// the lines a microkernel call prefetches.
Ahead rows_ahead(const View& v, int64_t r0, int64_t lo, int64_t hi, int64_t k0, int kc) {
  if (lo >= hi) return Ahead{};
  const int64_t size = v.type == GemmElem::F32 ? 4 : 2;
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data) + static_cast<uintptr_t>(v.at(r0 + lo, k0) * size);
  const int64_t stride = v.ld * size;
  // A row that starts inside a line spans one more; rows a multiple of 64 bytes apart all
  // start where the first does.
  const bool skew = ((p | static_cast<uintptr_t>(stride)) & 63) != 0;
  return Ahead{reinterpret_cast<const char*>(p & ~uintptr_t{63}), stride, static_cast<int>(hi - lo),
               static_cast<int>((kc * size + 63) / 64 + (skew ? 1 : 0))};
}

// The two kinds of panel the loops below run: FP32 (one k per entry) and, on the
// avx512bf16 path, BF16 pairs (two k per 32-bit entry). `depth`: entries per panel row.
template <class T>
struct F32Panels {
  using Tile = T;
  using Entry = float;
  static int64_t block_k(int kc) { return kc; }  // k per block
  static int depth(int kc) { return kc; }
  static void pack_a_block(const View& v, int64_t ic, int64_t mc, int64_t k0, int kc, float* dst, float* scratch) {
    pack_block<T::kMR>(v, ic, mc, k0, kc, dst, scratch);
  }
  static void pack_b(const View& v, int64_t jc, int64_t nc, int64_t pc, int kc, float* dst, float* scratch) {
    pack_block<T::kNR>(v, jc, nc, pc, kc, dst, scratch);
  }
  static void pack_b_panel(const View& v, int64_t j0, int cols, int64_t pc, int kc, float* dst, float* scratch) {
    pack_panel<T::kNR>(v, j0, cols, pc, kc, dst, scratch);
  }
  static void micro(int kc, const float* a, const float* b, float* c, int64_t ldc, int rows, int cols, bool overwrite,
                    const float* bias, const Ahead& ahead) {
    run_tile<F32Step, T>(kc, a, b, c, ldc, rows, cols, overwrite, bias, ahead);
  }
};
#if defined(BELAY_ISA_avx512bf16)
struct PairPanels {
  using Tile = Narrow;
  using Entry = uint32_t;
  static int64_t block_k(int kc) { return 2 * static_cast<int64_t>(kc); }  // kc pairs
  static int depth(int kc) { return (kc + 1) / 2; }
  static void pack_a_block(const View& v, int64_t ic, int64_t mc, int64_t k0, int kc, uint32_t* dst, float*) {
    for (int64_t ir = 0; ir < mc; ir += kMR)
      pack_pairs<kMR>(v, ic + ir, static_cast<int>(min64(kMR, mc - ir)), k0, kc, dst + ir * depth(kc));
  }
  static void pack_b(const View& v, int64_t jc, int64_t nc, int64_t pc, int kc, uint32_t* dst, float*) {
    pack_b_pairs(v, jc, nc, pc, kc, dst);
  }
  static void pack_b_panel(const View& v, int64_t j0, int cols, int64_t pc, int kc, uint32_t* dst, float*) {
    pack_pairs<kNR>(v, j0, cols, pc, kc, dst);
  }
  static void micro(int kc, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, int rows, int cols,
                    bool overwrite, const float* bias, const Ahead& ahead) {
    run_tile<PairStep, Narrow>((kc + 1) / 2, a, b, c, ldc, rows, cols, overwrite, bias, ahead);
  }
};
#endif

// One packed A block (mc rows of C from ic) by one packed B block (nc columns from jc), at
// k block pc of depth `depth` entries (kc k): what the two orders of the inner loops share.
struct BlockPair {
  const GemmF32Args& g;
  int64_t n_total, ic, mc, jc, nc, pc, depth;
  int kc;
  bool first, last;  // the first and last k block: C overwritten, bias added
  const float* bias(int64_t jr) const { return (last && g.bias) ? g.bias + jc + jr : nullptr; }
  float* c(int64_t ir, int64_t jr) const { return g.c + (ic + ir) * n_total + jc + jr; }
};

// The block pair's microkernel calls an A panel at a time: it stays in L1 while the B panels
// stream from L2 (GemmBlocking::a_in_l1; gemm_blocking.h says why and where).
template <class Panels>
void a_panel_rows(const BlockPair& p, const typename Panels::Entry* a_buf, const typename Panels::Entry* b_buf) {
  constexpr int kMR = Panels::Tile::kMR, kNR = Panels::Tile::kNR;
  for (int64_t ir = 0; ir < p.mc; ir += kMR)
    for (int64_t jr = 0; jr < p.nc; jr += kNR)
      Panels::micro(p.kc, a_buf + ir * p.depth, b_buf + jr * p.depth, p.c(ir, jr), p.n_total,
                    static_cast<int>(min64(kMR, p.mc - ir)), static_cast<int>(min64(kNR, p.nc - jr)),
                    p.first && !p.g.accumulate, p.bias(jr), Ahead{});
}

// The block pair's microkernel calls a B panel at a time, the panel in L1 while the A panels
// stream from L2. `pack_panels`: op(B) (k-contiguous, bv) is packed here, a panel just before
// its first use, and the calls on a panel prefetch the next one's rows, a share each.
template <class Panels>
void b_panel_columns(const BlockPair& p, const View& bv, bool pack_panels, const typename Panels::Entry* a_buf,
                     typename Panels::Entry* b_buf, float* scratch) {
  constexpr int kMR = Panels::Tile::kMR, kNR = Panels::Tile::kNR;
  const int64_t tiles = (p.mc + kMR - 1) / kMR;
  for (int64_t jr = 0; jr < p.nc; jr += kNR) {
    const int cols = static_cast<int>(min64(kNR, p.nc - jr));
    typename Panels::Entry* panel = b_buf + jr * p.depth;
    if (pack_panels) Panels::pack_b_panel(bv, p.jc + jr, cols, p.pc, p.kc, panel, scratch);
    const int64_t next = pack_panels ? min64(kNR, p.nc - jr - kNR) : 0;  // the next panel's rows
    for (int64_t ir = 0, t = 0; ir < p.mc; ir += kMR, ++t) {
      const Ahead ahead =
          next > 0 ? rows_ahead(bv, p.jc + jr + kNR, next * t / tiles, next * (t + 1) / tiles, p.pc, p.kc) : Ahead{};
      Panels::micro(p.kc, a_buf + ir * p.depth, panel, p.c(ir, jr), p.n_total, static_cast<int>(min64(kMR, p.mc - ir)),
                    cols, p.first && !p.g.accumulate, p.bias(jr), ahead);
    }
  }
}

// The rows [m0, m1) x columns [n0, n1) of C, on the calling thread.
template <class Panels>
void gemm_slice(const GemmF32Args& g, const GemmBlocking& bl, const View& av, const View& bv, int64_t k_total,
                int64_t n_total, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  using Entry = typename Panels::Entry;
  static_assert(sizeof(Entry) == sizeof(float), "both kinds of panel fill the same buffers");
  Buffers& buf = buffers(bl);
  Entry* a_buf = reinterpret_cast<Entry*>(buf.a);
  Entry* b_buf = reinterpret_cast<Entry*>(buf.b);
  const int64_t block_k = Panels::block_k(bl.kc);
  // The a_in_l1 order where the slice is at least half an NC block wide: narrower, an A panel
  // meets too few B panels for its stay in L1 to pay, and the forward loses the pack by panel
  // (the default GPT's products, N = 128-512, took 1.03-1.10 of the time in that order).
  const bool a_in_l1 = bl.a_in_l1 && 2 * (n1 - n0) >= bl.nc;
  // A k-contiguous op(B) (the row-major weight of the forward product, transposed) is packed
  // a panel at a time, just before the first block of A uses it, and the microkernel calls
  // on the panel before prefetch its rows. Packing the whole block first, the thread waited
  // on DRAM with no FMA to overlap: 12-16% of the forward product's time. (An untransposed
  // B is still packed a block at a time, its rows read across all panels: see pack_block; and
  // every B in the a_in_l1 order, whose first A panel meets every B panel at once.)
  const bool by_panel = !bv.r_contiguous && !a_in_l1;
  for (int64_t jc = n0; jc < n1; jc += bl.nc) {
    const int64_t nc = min64(bl.nc, n1 - jc);
    for (int64_t pc = 0; pc < k_total; pc += block_k) {
      const int kc = static_cast<int>(min64(block_k, k_total - pc));
      if (!by_panel) Panels::pack_b(bv, jc, nc, pc, kc, b_buf, buf.scratch);
      for (int64_t ic = m0; ic < m1; ic += bl.mc) {
        const int64_t mc = min64(bl.mc, m1 - ic);
        Panels::pack_a_block(av, ic, mc, pc, kc, a_buf, buf.scratch);
        const BlockPair pair{g, n_total, ic, mc, jc, nc, pc, Panels::depth(kc), kc, pc == 0, pc + kc == k_total};
        if (a_in_l1) a_panel_rows<Panels>(pair, a_buf, b_buf);
        else b_panel_columns<Panels>(pair, bv, by_panel && ic == m0, a_buf, b_buf, buf.scratch);
      }
    }
  }
}

// C cut into one slice per thread, in whole panels of Panels' tile, each slice multiplied alone.
template <class Panels>
void run_slices(const GemmF32Args& g, const GemmBlocking& bl, const View& av, const View& bv, const GemmShape& shape) {
  const ThreadSlices slices = thread_slices(shape, Panels::Tile::kMR, Panels::Tile::kNR);
#pragma omp parallel for num_threads(static_cast<int>(slices.threads)) schedule(static, 1) if (slices.threads > 1)
  for (int64_t t = 0; t < slices.threads; ++t) {
    int64_t m0, m1, n0, n1;
    if (slices.slice(t, m0, m1, n0, n1)) gemm_slice<Panels>(g, bl, av, bv, shape.k, shape.n, m0, m1, n0, n1);
  }
}

// The Wide tile where the path has one and the caller asks for it, or leaves it to N.
bool wide_tile(GemmTile asked, int64_t n) {
  if (Wide::kNR == Narrow::kNR) return false;
  return asked == GemmTile::Wide || (asked == GemmTile::Auto && gemm_prefers_wide_tile(n, Wide::kNR));
}

}  // namespace

void gemm_packed(const GemmF32Args& g) {
  const GemmShape shape = gemm_shape(g);
  if (gemm_done_without_sums(g, shape)) return;
  const View av{g.a, g.a_type, g.a_cols, g.trans_a};   // op(A) as M x K
  const View bv{g.b, g.b_type, g.b_cols, !g.trans_b};  // op(B) as N x K
  const GemmBlocking bl = checked_blocking(g.blocking);
#if defined(BELAY_ISA_avx512bf16)
  if (g.a_type == GemmElem::BF16 && g.b_type == GemmElem::BF16) return run_slices<PairPanels>(g, bl, av, bv, shape);
#endif
  if (wide_tile(g.tile, shape.n))
    return run_slices<F32Panels<Wide>>(g, gemm_blocking_for_tile(bl, Wide::kMR, Wide::kNR), av, bv, shape);
  run_slices<F32Panels<Narrow>>(g, bl, av, bv, shape);
}

MicroTile gemm_micro_tile() { return MicroTile{kMR, kNR, kKCMax}; }
GemmBlocking gemm_default_blocking() { return default_blocking(); }

}  // namespace belay::BELAY_ISA_NS
