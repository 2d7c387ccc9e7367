// The element kernels' inner loops for one vector ISA (element_blocks.h). Built once per path
// by isa.cmake with -ffp-contract=off (a * b + c stays two roundings, as the baseline and the
// GPU compute it) and -fno-math-errno (sqrtf may vectorize: no errno branch per element).
// element_math.h and half_bits.h are included with BELAY_HD = static inline, so their
// functions are private to this copy (the one-definition rule: docs/toolchain.md).
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/element_blocks.cpp is built once per ISA by isa.cmake"
#endif
#define BELAY_HD static inline
#include "kernels/cpu/isa/element_blocks.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "engine/half_bits.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/isa/erf_exp.h"

namespace belay::BELAY_ISA_NS {
namespace {

void f32_to_bf16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_bits_select(src[i]);  // vectorizes: a select
}

void bf16_to_f32(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_from_bits(static_cast<uint32_t>(src[i]) << 16);
}

int unscale(const float* v, float* r, int64_t n, float inv) {
  int bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    r[j] = v[j] * inv;
    bad |= is_finite_f32(r[j]) ? 0 : 1;
  }
  return bad;
}

// ---- The guard's sums of squares ------------------------------------------------------------
// The smallest 16-bit magnitude pattern of elem (FP16 or BF16) whose value is at least t, so
// that |x| < t exactly when (bits & 0x7fff) is below it.
uint16_t first_bits_at_least(float t, GemmElem elem) {
  uint32_t lo = 0, hi = elem == GemmElem::F16 ? 0x7c00u : 0x7f80u;  // +inf: at least any t
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    const float v = elem == GemmElem::F16 ? f16_bits_to_f32(static_cast<uint16_t>(mid))
                                          : bf16_bits_to_f32(static_cast<uint16_t>(mid));
    if (v >= t) hi = mid;
    else lo = mid + 1;
  }
  return static_cast<uint16_t>(lo);
}

// ---- The census, wide ------------------------------------------------------------------------
// The guard's loads are 8 values wide (its transposition keeps each chunk's sum in order).
// After it has summed a group of steps, the census reads those steps of every chunk again,
// from L1, as wide integer vectors of magnitudes (the bits with the sign cleared, whose
// patterns order as the values do) and counts each class by one compare against a bound
// pattern and one subtract (avx2) or saturating arithmetic (avx512): an and, a max and 2
// operations per distinct bound (6 at most for 16-bit data in its own format) per vector of 16
// (avx2) or 32 (avx512) stored 16-bit values, where census8 took 11 per 8 values (and its
// finiteness compare). FP32 buffers go through the batch loop on the AVX paths
// (census_8_as_batch); their WideFloats only recount a flagged block (ChunkRecounts). The values are taken as
// finite: an inf or NaN makes the sums non-finite, and the call is counted again in full
// (census_all, census_full_of on the baseline path); with none, nothing is non-finite and the
// amax is the largest pattern. Used by the dense loop on every group and by the wider sparse
// loops on the groups their scan flags. The baseline path counts the same way on SSE2, one
// step per group (4 FP32 or 8 stored 16-bit values per vector: its WideHalves and WideFloats).

// The census's bounds as magnitude patterns: a value is an exact zero below 1, rounds to zero
// below `tiny`, and is a subnormal (or less) below `sub`. For 16-bit data in its own format
// no pattern lies between zero and the first subnormal (tiny == 1), and FP16 data has no
// subnormal in BF16 (sub == 1 too): such a bound is not compared again.
struct WideBounds {
  uint32_t tiny, sub;
  WideBounds(CensusBounds b, GemmElem e)
      : tiny(e == GemmElem::F32 ? f32_bits(b.to_zero) + 1 : first_bits_at_least(std::nextafter(b.to_zero, INFINITY), e)),
        sub(e == GemmElem::F32 ? f32_bits(b.subnormal_below) : first_bits_at_least(b.subnormal_below, e)) {}
  // How many distinct bounds, 1 <= tiny <= sub: 1, 2 or 3.
  int distinct() const { return 1 + (tiny != 1 ? 1 : 0) + (sub != tiny ? 1 : 0); }
};

// Lane counters of magnitudes below each of the kBounds distinct bounds (1, then tiny and sub
// where they differ from the one before), and the largest magnitude, over groups of kVecs
// vectors of each chunk. A lane gains at most 16 per group (kVecs <= 2 vectors per chunk), so
// 16-bit lanes are added into 64-bit totals every kFlushGroups groups, before they can wrap.
template <class W, int kBounds, int kVecs = 1>
struct WideCensus {
  using Vec = typename W::Vec;
  using Lane = typename W::Lane;
  static constexpr int kLanes = sizeof(Vec) / sizeof(Lane);
  static constexpr int kSteps = kVecs * kLanes / 8;  // the guard's steps per group
  static constexpr int kFlushGroups = 256;  // 16 x 256 < 2^16; every dense call of kReduceChunk flushes
  static_assert(kVecs <= 2, "16-bit lanes flushed before they wrap");
  GemmElem elem;
  Vec mask, bound[kBounds], n[kBounds], hi = W::set1(0);
  uint64_t below[kBounds] = {};
  int tiny_at, sub_at;  // which bound is tiny's, sub's
  int groups = 0;

  WideCensus(WideBounds wb, GemmElem e) : elem(e), mask(W::set1(e == GemmElem::F32 ? 0x7fffffffu : 0x7fffu)) {
    tiny_at = wb.tiny != 1 ? 1 : 0;
    sub_at = tiny_at + (wb.sub != wb.tiny ? 1 : 0);
    const uint32_t bounds[3] = {1, wb.tiny, wb.sub};
    for (Vec& v : bound) v = W::set1(0);  // each set below (kBounds: distinct()), as the compiler cannot see
    for (int i = 0, at = 0; i < 3; ++i)
      if ((i == 0 || bounds[i] != bounds[i - 1]) && at < kBounds) bound[at++] = W::set1(bounds[i]);
    for (Vec& v : n) v = W::set1(0);
  }
  // The census of the group's kVecs x kLanes values of each of the 8 chunks, from element j on.
  void add(const void* x, int64_t stride, int64_t j) {
    add_chunks(x, stride, j, 0, 8);
    end_group();
  }
  // The same for chunks k0 to k1 - 1 only (a group's census spread over its steps), then
  // end_group() once per group.
  void add_chunks(const void* x, int64_t stride, int64_t j, int k0, int k1) {
    const Lane* p = static_cast<const Lane*>(x);
    for (int k = k0; k < k1; ++k)
      for (int v = 0; v < kVecs; ++v) {
        const Vec a = W::load(p + k * stride + j + v * kLanes) & mask;
        n[0] = W::add_zero(n[0], a);  // below 1, as one compare (a compiler may turn a < 1 into two)
        for (int i = 1; i < kBounds; ++i) n[i] = W::add_below(n[i], a, bound[i]);
        hi = W::max(hi, a);
      }
  }
  void end_group() {
    if (++groups == kFlushGroups) flush();
  }
  void flush() {
    for (int i = 0; i < kBounds; ++i) {
      Lane l[kLanes];
      std::memcpy(l, &n[i], sizeof n[i]);
      for (const Lane c : l) below[i] += c;
      n[i] = W::set1(0);
    }
    groups = 0;
  }
  // The counts, into *counts (the values all finite).
  void into(CensusCounts* counts) {
    flush();
    counts->zeros += below[0];
    counts->underflow += below[tiny_at] - below[0];
    counts->subnormal += below[sub_at] - below[tiny_at];
    Lane l[kLanes];
    std::memcpy(l, &hi, sizeof hi);
    Lane top = 0;
    for (const Lane h : l) top = h > top ? h : top;
    const float amax = elem == GemmElem::F32   ? f32_from_bits(top)
                       : elem == GemmElem::F16 ? f16_bits_to_f32(static_cast<uint16_t>(top))
                                               : bf16_bits_to_f32(static_cast<uint16_t>(top));
    counts->amax = amax > counts->amax ? amax : counts->amax;
  }
};

// Element i of x, as FP32 (exact).
inline float grad_at(const void* x, GemmElem elem, int64_t i) {
  if (elem == GemmElem::F32) return static_cast<const float*>(x)[i];
  const uint16_t h = static_cast<const uint16_t*>(x)[i];
  return elem == GemmElem::F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
}

// The census of n finite values of one chunk, as census_class counts them, by their stored
// patterns (WideCensus: a compare and an add per distinct bound per vector of this path's
// WideFloats or WideHalves), the tail past the vectors one by one: a batch's chunk, or block of
// one, that held values below the normal range, counted again from L1.
template <class W, int kBounds>
void census_finite_of(const void* x, GemmElem elem, int64_t n, CensusBounds b, CensusCounts* counts) {
  WideCensus<W, kBounds> census(WideBounds(b, elem), elem);
  const int64_t whole = n / census.kLanes * census.kLanes;
  for (int64_t j = 0; j < whole; j += census.kLanes) {
    census.add_chunks(x, 0, j, 0, 1);  // one chunk: a lane gains at most 1 a group
    census.end_group();
  }
  census.into(counts);
  for (int64_t j = whole; j < n; ++j) {
    const float v = grad_at(x, elem, j);
    counts->add(census_class(v, b), v);
  }
}

template <class W>
void census_finite_bounds(const void* x, GemmElem elem, int64_t n, CensusBounds b, CensusCounts* counts) {
  const int distinct = WideBounds(b, elem).distinct();
  if (distinct == 1) census_finite_of<W, 1>(x, elem, n, b, counts);
  else if (distinct == 2) census_finite_of<W, 2>(x, elem, n, b, counts);
  else census_finite_of<W, 3>(x, elem, n, b, counts);
}

#if defined(BELAY_ISA_avx2) || defined(BELAY_ISA_avx512)
// Eight elements of one chunk, widened exactly (F16C for FP16; BF16 is FP32's top half).
inline __m256 load8(const void* x, GemmElem elem, int64_t i) {
  if (elem == GemmElem::F32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  if (elem == GemmElem::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Four elements of one chunk from x[i], then four of another from x2[i2], widened exactly.
template <GemmElem E>
inline __m256 load4_pair(const void* x, int64_t i, const void* x2, int64_t i2) {
  if constexpr (E == GemmElem::F32) {
    const float* p = static_cast<const float*>(x);
    const float* p2 = static_cast<const float*>(x2);
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p + i)), _mm_loadu_ps(p2 + i2), 1);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x);
    const uint16_t* p2 = static_cast<const uint16_t*>(x2);
    const __m128i h = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p2 + i2)));
    if constexpr (E == GemmElem::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

#if defined(BELAY_ISA_avx512)
// Eight elements of one chunk from x[i], then eight of another from x2[i2], widened exactly.
template <GemmElem E>
inline __m512 load16_pair(const void* x, int64_t i, const void* x2, int64_t i2) {
  if constexpr (E == GemmElem::F32) {
    const float* p = static_cast<const float*>(x);
    const float* p2 = static_cast<const float*>(x2);
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(p + i)), _mm256_loadu_ps(p2 + i2), 1);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x);
    const uint16_t* p2 = static_cast<const uint16_t*>(x2);
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + i2)), 1);
    if constexpr (E == GemmElem::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
#endif

// The guard reads 8 streams kReduceChunk elements apart. Each step asks for the line
// kPrefetchAhead bytes further on in every stream, once per 64-byte line: with the census's work
// in the loop the hardware's own prefetch fell behind (FP32 from memory, prefetching in the
// dense census loop alone took it from 1.09-1.10x the plain guard's time to 0.97-0.98x; 1024,
// 2048 and 4096 bytes ahead alike). The plain guard prefetches the same way (it ran 6-14%
// faster with it), so the census's cost is measured against the faster guard.
constexpr int64_t kPrefetchAhead = 1024;
inline void prefetch_step(const void* x, GemmElem elem, int64_t stride, int64_t j) {
  const int64_t elem_bytes = elem == GemmElem::F32 ? 4 : 2;
  const int64_t at = j * elem_bytes;
  if ((at & 63) != 0) return;
  const char* p = static_cast<const char*>(x) + at + kPrefetchAhead;
  for (int k = 0; k < 8; ++k) _mm_prefetch(p + k * stride * elem_bytes, _MM_HINT_T0);
}

// p, as an address the compiler can no longer trace: loads through it read memory (not the
// values just stored there, forwarded), and no other object is taken as written. An asm with p's
// memory as an operand ("+m") did the first, but made the compiler keep the census loops'
// FP64 sums in memory, a store and a reload on their chain every step.
inline const float* untraced(const float* p) {
  asm("" : "+r"(p));
  return p;
}

// r[i][j] -> r[j][i] for 8 x 8 floats (bit moves only).
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The 8 chunks' sums of squares in FP64, lane k for chunk k, in each chunk's order. Each
// square is exact in FP64 (a product of two 24-bit significands), so the FMA that adds it
// rounds once, as the separate multiply and add did: the same bits, one operation fewer.
struct SquareSums {
#if defined(BELAY_ISA_avx512)
  __m512d acc = _mm512_setzero_pd();
  __m512 vinv;
  explicit SquareSums(float inv) : vinv(_mm512_set1_ps(inv)) {}
#else
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  __m256 vinv;
  explicit SquareSums(float inv) : vinv(_mm256_set1_ps(inv)) {}
#endif
  // r[k]: 8 scaled elements of chunk k. Transposed, r[jj] holds element j + jj of every chunk.
  void add(__m256 (&r)[8]) {
    transpose8(r);
    add_columns(r);
  }
#if defined(BELAY_ISA_avx512)
  // r[jj]: element j + jj of every chunk (lane k: chunk k), unscaled: scaled (the products of
  // scaling before the transposition), then added.
  void add_unscaled_columns(__m256 (&r)[8]) {
    for (int jj = 0; jj < 8; ++jj) r[jj] = _mm256_mul_ps(r[jj], _mm512_castps512_ps256(vinv));
    add_columns(r);
  }
#endif
  // r[jj]: element j + jj of every chunk (lane k: chunk k), scaled.
  void add_columns(const __m256 (&r)[8]) {
    for (int jj = 0; jj < 8; ++jj) {
#if defined(BELAY_ISA_avx512)
      const __m512d d = _mm512_cvtps_pd(r[jj]);
      acc = _mm512_fmadd_pd(d, d, acc);
#else
      add_column(r[jj]);
#endif
    }
  }
#if defined(BELAY_ISA_avx512)
  // a[k]: chunk k's 8 elements, then chunk k + 4's. A 4 x 4 transposition in each 128-bit
  // lane leaves column c of chunks 0-3, column c + 4 of chunks 0-3, column c of chunks 4-7 and
  // column c + 4 of chunks 4-7; one lane swap puts each column's 8 together: a[c] then holds
  // column c of the 8 chunks (lane k: chunk k), then column c + 4 (lane 8 + k). Bit moves only.
  static void columns16(__m512 (&a)[4]) {
    const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
    const __m512 b[4] = {_mm512_shuffle_ps(t0, t2, 0x44), _mm512_shuffle_ps(t0, t2, 0xee),
                         _mm512_shuffle_ps(t1, t3, 0x44), _mm512_shuffle_ps(t1, t3, 0xee)};
    for (int c = 0; c < 4; ++c) a[c] = _mm512_shuffle_f32x4(b[c], b[c], 0xd8);
  }
  // columns16's columns, unscaled: scaled, and their squares added column by column, 0 to 7.
  void add_columns16(const __m512 (&cols)[4]) {
    alignas(64) float scaled[4][16];
    for (int c = 0; c < 4; ++c) _mm512_store_ps(scaled[c], _mm512_mul_ps(cols[c], vinv));
    // Widened from memory: vcvtps2pd from a register costs a port-5 shuffle on top (and the
    // upper half an extract), the census's port; kept so by reading through an untraced address
    // (the compiler would forward the stores into extracts). 10.8 against 11.4 ns a step with
    // census work, in cache.
    const float* from = untraced(&scaled[0][0]);
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 4; ++c) {
        const __m512d d = _mm512_cvtps_pd(_mm256_load_ps(from + 16 * c + 8 * h));
        acc = _mm512_fmadd_pd(d, d, acc);
      }
  }
#endif
  // One step, 8 elements of each chunk from j on: loaded, scaled and summed as add(r) sums
  // them, in the same order, with fewer shuffles where the path has a way (below).
  template <GemmElem E>
  void add_step(const void* x, int64_t stride, int64_t j) {
#if defined(BELAY_ISA_avx512)
    __m512 a[4];
    for (int k = 0; k < 4; ++k) a[k] = load16_pair<E>(x, k * stride + j, x, (k + 4) * stride + j);
    columns16(a);
    add_columns16(a);
#else
    if constexpr (E == GemmElem::F32) {
      __m256 a[8];
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 2; ++h) a[k + 4 * h] = load4_pair<E>(x, k * stride + j + 4 * h, x, (k + 4) * stride + j + 4 * h);
      columns8(a);
      add_columns8(a);
    } else {
      __m256 r[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_mul_ps(load8(x, E, k * stride + j), vinv);
      add(r);
    }
#endif
  }
#if !defined(BELAY_ISA_avx512)
  // a[k] for k < 4: columns 0-3 of chunk k, then of chunk k + 4 (the upper half inserted from
  // memory, not permuted in, load4_pair); a[k + 4]: their columns 4-7. An in-lane 4 x 4
  // transposition leaves in a[c] column c of the 8 chunks (lane k: chunk k): 16 shuffles, not
  // transpose8's 24. Bit moves only.
  static void columns8(__m256 (&a)[8]) {
    __m256 cols[8];
    for (int h = 0; h < 2; ++h) {
      const __m256* q = a + 4 * h;
      const __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpackhi_ps(q[0], q[1]);
      const __m256 t2 = _mm256_unpacklo_ps(q[2], q[3]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
      cols[4 * h + 0] = _mm256_shuffle_ps(t0, t2, 0x44);
      cols[4 * h + 1] = _mm256_shuffle_ps(t0, t2, 0xee);
      cols[4 * h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
      cols[4 * h + 3] = _mm256_shuffle_ps(t1, t3, 0xee);
    }
    for (int c = 0; c < 8; ++c) a[c] = cols[c];
  }
  // columns8's columns, unscaled: scaled, and their squares added column by column, 0 to 7,
  // widened from memory as on avx512 (add_columns16).
  void add_columns8(const __m256 (&cols)[8]) {
    alignas(32) float scaled[8][8];
    for (int c = 0; c < 8; ++c) _mm256_store_ps(scaled[c], _mm256_mul_ps(cols[c], vinv));
    const float* from = untraced(&scaled[0][0]);
    for (int c = 0; c < 8; ++c) {
      const __m256d dlo = _mm256_cvtps_pd(_mm_load_ps(from + 8 * c));
      const __m256d dhi = _mm256_cvtps_pd(_mm_load_ps(from + 8 * c + 4));
      lo = _mm256_fmadd_pd(dlo, dlo, lo);
      hi = _mm256_fmadd_pd(dhi, dhi, hi);
    }
  }
  void add_column(__m256 col) {
    const __m256d dlo = _mm256_cvtps_pd(_mm256_castps256_ps128(col));
    const __m256d dhi = _mm256_cvtps_pd(_mm256_extractf128_ps(col, 1));
    lo = _mm256_fmadd_pd(dlo, dlo, lo);
    hi = _mm256_fmadd_pd(dhi, dhi, hi);
  }
#endif
  // Writes the 8 sums; true when all are finite (no inf or NaN was summed).
  bool store(double* out) const {
#if defined(BELAY_ISA_avx512)
    _mm512_storeu_pd(out, acc);
#else
    _mm256_storeu_pd(out, lo);
    _mm256_storeu_pd(out + 4, hi);
#endif
    bool finite = true;
    for (int k = 0; k < 8; ++k) finite = finite && std::isfinite(out[k]);
    return finite;
  }
};

// Reading the 8 chunks 8 elements at a time (one stream each, a whole line per two loads),
// then transposing, turns 8 strided scalar sums into one vector of 8 in-order sums.
template <GemmElem E>
void sum_squares_8_of(const void* x, int64_t stride, int64_t len, float inv, double* out) {
  SquareSums sums(inv);
  for (int64_t j = 0; j < len; j += 8) {
    prefetch_step(x, E, stride, j);
    sums.add_step<E>(x, stride, j);
  }
  sums.store(out);
}

void sum_squares_8(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, double* out) {
  if (elem == GemmElem::F32) sum_squares_8_of<GemmElem::F32>(x, stride, len, inv, out);
  else if (elem == GemmElem::F16) sum_squares_8_of<GemmElem::F16>(x, stride, len, inv, out);
  else sum_squares_8_of<GemmElem::BF16>(x, stride, len, inv, out);
}

// The census of 8 stored values at a time, as lane counts: the classes of census_class
// taken as nested comparisons (finite, |x| <= to_zero, |x| < subnormal_below, x == 0), each
// lane counting how many of its values passed (a true compare is -1, subtracted). Counts
// stay in 32 bits per lane: one call sees at most 8 x kReduceChunk values.
struct CensusLanes {
  __m256i finite = _mm256_setzero_si256(), tiny = _mm256_setzero_si256(), sub = _mm256_setzero_si256(),
          zero = _mm256_setzero_si256();
  __m256 amax = _mm256_setzero_ps();
};

inline void census8(__m256 x, __m256 to_zero, __m256 sub_below, CensusLanes& c) {
  const __m256 a = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 finite = _mm256_cmp_ps(a, _mm256_set1_ps(3.40282347e38f), _CMP_LE_OQ);  // false for NaN
  c.finite = _mm256_sub_epi32(c.finite, _mm256_castps_si256(finite));
  c.tiny = _mm256_sub_epi32(c.tiny, _mm256_castps_si256(_mm256_cmp_ps(a, to_zero, _CMP_LE_OQ)));
  c.sub = _mm256_sub_epi32(c.sub, _mm256_castps_si256(_mm256_cmp_ps(a, sub_below, _CMP_LT_OQ)));
  c.zero = _mm256_sub_epi32(c.zero, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_EQ_OQ)));
  c.amax = _mm256_max_ps(c.amax, _mm256_and_ps(a, finite));
}

inline uint64_t lane_total(__m256i v) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  uint64_t t = 0;
  for (int k = 0; k < 8; ++k) t += static_cast<uint32_t>(l[k]);
  return t;
}

// The lane counts of `seen` values census8 saw, added into *counts as census classes.
inline void add_census_lanes(const CensusLanes& c, uint64_t seen, CensusCounts* counts) {
  const uint64_t finite = lane_total(c.finite), tiny = lane_total(c.tiny), sub = lane_total(c.sub),
                 zero = lane_total(c.zero);
  counts->nonfinite += seen - finite;
  counts->zeros += zero;
  counts->underflow += tiny - zero;
  counts->subnormal += sub - tiny;
  alignas(32) float m[8];
  _mm256_store_ps(m, c.amax);
  for (int k = 0; k < 8; ++k) counts->amax = m[k] > counts->amax ? m[k] : counts->amax;
}

// The census of the 64 values of step j (8 of each chunk), classified in full (census8),
// added into c. Not inlined: the sparse loop keeps its registers for its own work, and the
// values come back from L1, where that loop just read them.
__attribute__((noinline)) void census_step(const void* x, GemmElem elem, int64_t stride, int64_t j, CensusBounds b,
                                           CensusLanes* c) {
  const __m256 to_zero = _mm256_set1_ps(b.to_zero), sub_below = _mm256_set1_ps(b.subnormal_below);
  for (int k = 0; k < 8; ++k) census8(load8(x, elem, k * stride + j), to_zero, sub_below, *c);
}

// v's magnitudes folded into lo (the smallest so far) and hi (the largest), lane by lane: 3
// operations (and, min, max), 2 where AVX-512DQ's vrangeps takes the smaller or larger
// magnitude in one. A NaN passes unseen (min, max and vrangeps all return the other operand):
// the callers find it in the sums, which it makes NaN.
inline void fold_magnitudes(__m256 v, __m256& lo, __m256& hi) {
#if defined(BELAY_ISA_avx512)
  constexpr int kMinMagnitude = 0b1010, kMaxMagnitude = 0b1011;  // sign cleared: |result|
  lo = _mm256_range_ps(v, lo, kMinMagnitude);
  hi = _mm256_range_ps(v, hi, kMaxMagnitude);
#else
  const __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  lo = _mm256_min_ps(a, lo);  // a NaN a returns lo
  hi = _mm256_max_ps(a, hi);
#endif
}

// The smallest magnitude of step j's 64 values as a lane vector, and their largest folded into
// *amax (fold_magnitudes). A NaN passes unseen: the sums are NaN and the caller counts the
// call again in full.
inline __m256 step_min_max(const void* x, GemmElem elem, int64_t stride, int64_t j, float inv, __m256 (&r)[8],
                           __m256* amax) {
  const __m256 vinv = _mm256_set1_ps(inv);
  __m256 lo = _mm256_set1_ps(3.40282347e38f);
  for (int k = 0; k < 8; ++k) {
    const __m256 v = load8(x, elem, k * stride + j);
    fold_magnitudes(v, lo, *amax);
    r[k] = _mm256_mul_ps(v, vinv);
  }
  return lo;
}

inline bool any_below(__m256 lo, CensusBounds b) {
  return _mm256_movemask_ps(_mm256_cmp_ps(lo, _mm256_set1_ps(b.subnormal_below), _CMP_LT_OQ)) != 0;
}

// The census of every value of the call, classified in full (census_step): where the sums
// are not finite, an inf or a NaN passed a loop that assumed none (a second read, of data
// the first left in the cache, and only for a call that overflowed).
void census_all(const void* x, GemmElem elem, int64_t stride, int64_t len, CensusBounds b, CensusCounts* counts) {
  CensusLanes all;
  for (int64_t j = 0; j < len; j += 8) census_step(x, elem, stride, j, b, &all);
  add_census_lanes(all, static_cast<uint64_t>(len) * 8, counts);
}

// Whether n consecutive values (a multiple of 32) are all normal and finite: the smallest and
// largest magnitude patterns (an and, a min and a max per vector of 8 FP32 or 16 stored 16-bit
// values), the first against the normal range's first pattern (`sub`), the second against
// infinity's; their largest value, as FP32, into *amax.
bool all_normal(const void* x, GemmElem elem, int64_t n, uint32_t sub, float* amax) {
  // (Lanes folded by shuffles, not through an array: GCC kept the loop's vectors in the array's
  // stack slots, a store and a reload every step.)
  if (elem == GemmElem::F32) {
    const __m256i mask = _mm256_set1_epi32(0x7fffffff);
    const float* p = static_cast<const float*>(x);
    __m256i lo = mask, hi = _mm256_setzero_si256(), lo2 = mask, hi2 = hi;  // two chains each
    for (int64_t j = 0; j < n; j += 16) {
      const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j)), mask);
      const __m256i c = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j + 8)), mask);
      lo = _mm256_min_epu32(lo, a), lo2 = _mm256_min_epu32(lo2, c);
      hi = _mm256_max_epu32(hi, a), hi2 = _mm256_max_epu32(hi2, c);
    }
    lo = _mm256_min_epu32(lo, lo2), hi = _mm256_max_epu32(hi, hi2);
    __m128i l = _mm_min_epu32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    l = _mm_min_epu32(l, _mm_shuffle_epi32(l, 0x4e)), h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    l = _mm_min_epu32(l, _mm_shuffle_epi32(l, 0xb1)), h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    const uint32_t lo_bits = static_cast<uint32_t>(_mm_cvtsi128_si32(l)), hi_bits = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
    if (lo_bits < sub || hi_bits >= 0x7f800000u) return false;
    *amax = f32_from_bits(hi_bits);
    return true;
  }
  const __m256i mask = _mm256_set1_epi16(0x7fff);
  const uint16_t* p = static_cast<const uint16_t*>(x);
  __m256i lo = mask, hi = _mm256_setzero_si256(), lo2 = mask, hi2 = hi;
  for (int64_t j = 0; j < n; j += 32) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j)), mask);
    const __m256i c = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j + 16)), mask);
    lo = _mm256_min_epu16(lo, a), lo2 = _mm256_min_epu16(lo2, c);
    hi = _mm256_max_epu16(hi, a), hi2 = _mm256_max_epu16(hi2, c);
  }
  lo = _mm256_min_epu16(lo, lo2), hi = _mm256_max_epu16(hi, hi2);
  const __m128i l = _mm_min_epu16(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  const __m128i h = _mm_max_epu16(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  // SSE4.1's minpos: the smallest of 8 unsigned 16-bit lanes; the largest as the smallest complement.
  const uint32_t lo_bits = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(l))) & 0xffffu;
  const uint32_t hi_bits = ~static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(h, _mm_set1_epi16(-1))))) & 0xffffu;
  if (lo_bits < sub || hi_bits >= (elem == GemmElem::F16 ? 0x7c00u : 0x7f80u)) return false;
  *amax = elem == GemmElem::F16 ? f16_bits_to_f32(static_cast<uint16_t>(hi_bits)) : bf16_bits_to_f32(static_cast<uint16_t>(hi_bits));
  return true;
}

// n consecutive values: where the largest multiple of 64 are all normal and finite (as a
// sound loss scale leaves most gradients), only their largest (all_normal); else those as 8
// runs side by side, classified in full (census_all's steps: the census is a count, so any
// split of the values counts the same); the rest one by one.
void census_run(const void* x, GemmElem elem, int64_t n, CensusBounds b, CensusCounts* counts) {
  const int64_t run = n / 64 * 8;
  thread_local float last_bound = -1.0f;  // the normal range's first pattern, found once per format
  thread_local GemmElem last_elem = GemmElem::F32;
  thread_local uint32_t sub = 0;
  if (b.subnormal_below != last_bound || elem != last_elem)
    last_bound = b.subnormal_below, last_elem = elem, sub = WideBounds(b, elem).sub;
  float top = 0.0f;
  if (run > 0 && all_normal(x, elem, 8 * run, sub, &top)) {
    counts->amax = top > counts->amax ? top : counts->amax;
  } else if (run > 0) {
    census_all(x, elem, run, run, b, counts);
  }
  for (int64_t j = 8 * run; j < n; ++j) {
    const float v = grad_at(x, elem, j);
    counts->add(census_class(v, b), v);
  }
}

// What a batch's census takes from each column of sum_steps_at, as FP32 (F16 and BF16 widened
// exactly): a vector V of 8 lanes (__m256: lane k, chunk k) or, for avx512's FP16 and BF16
// batches, 16 (__m512: lane 8 + k too, columns16's layout). FP32 batches are 8 columns of 8 on
// every AVX path, a 256-bit vrangeps on each: on Zen 4 the default GPT's census took 1.06-1.08x
// the guard's time so (a throwaway driver, 300 alternated samples), 1.16-1.17x in columns16's
// layout (loaded so, or packed from 8 columns by inserts): a 512-bit vrangeps does the work of
// two 256-bit ones there, and the layout's shuffles and inserts came on top.
template <int kWidth>
struct ColumnTypes;
template <>
struct ColumnTypes<8> {
  using V = __m256;
  using Bits = __m256i;
};
#if defined(BELAY_ISA_avx512)
template <>
struct ColumnTypes<16> {
  using V = __m512;
  using Bits = __m512i;
};
#endif

// Nothing: the guard alone.
struct NoColumns {
  void column(__m256, int) {}
#if defined(BELAY_ISA_avx512)
  void column(__m512, int) {}
#endif
};

// Plain blocks: each chunk's smallest and largest magnitude (2 operations a column where
// AVX-512DQ's vrangeps takes the smaller or larger magnitude in one, 3 on avx2: fold_magnitudes;
// a NaN passes unseen, the chunk's sum NaN instead). Two chains of each on avx512 (vrangeps
// waits 2 cycles on Zen 4, 4 on Intel); one on avx2, whose 8 columns a step wait 8 cycles on Zen
// 3 (32 on Intel) beside the step's FP64 chains of 8 FMAs (32), and the default GPT's census took
// 1.08-1.18x the guard's time against 1.24-1.31x with two (Zen 3, alternated runs).
template <int kWidth>
struct Magnitudes {
  using V = typename ColumnTypes<kWidth>::V;
  static constexpr bool kWide = kWidth == 16;
#if defined(BELAY_ISA_avx512)
  static constexpr int kChainMask = 1;
#else
  static constexpr int kChainMask = 0;
#endif
  static V set1(float v) {
    if constexpr (kWide) return _mm512_set1_ps(v);
    else return _mm256_set1_ps(v);
  }
  V lo[2] = {set1(3.40282347e38f), set1(3.40282347e38f)}, hi[2] = {set1(0.0f), set1(0.0f)};
  void column(V v, int c) {
#if defined(BELAY_ISA_avx512)
    if constexpr (kWide) {
      lo[c & kChainMask] = _mm512_range_ps(v, lo[c & kChainMask], 0b1010);
      hi[c & kChainMask] = _mm512_range_ps(v, hi[c & kChainMask], 0b1011);
    } else
#endif
      fold_magnitudes(v, lo[c & kChainMask], hi[c & kChainMask]);
  }
  // Bit k: chunk k held a magnitude below `bound` since the last call (the smallest restarts).
  unsigned below(float bound) {
    unsigned m;
#if defined(BELAY_ISA_avx512)
    if constexpr (kWide) {
      m = _mm512_cmp_ps_mask(_mm512_range_ps(lo[0], lo[1], 0b1010), set1(bound), _CMP_LT_OQ);
      m = (m | m >> 8) & 0xffu;
    } else
#endif
      m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_min_ps(lo[0], lo[1]), set1(bound), _CMP_LT_OQ)));
    lo[0] = lo[1] = set1(3.40282347e38f);
    return m;
  }
  // Chunk k's largest into top[k].
  void largest(float (&top)[8]) const {
#if defined(BELAY_ISA_avx512)
    if constexpr (kWide) {
      const __m512 h = _mm512_range_ps(hi[0], hi[1], 0b1011);
      const __m256 h8 = _mm256_max_ps(_mm512_castps512_ps256(h), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(h), 1)));
      _mm256_storeu_ps(top, h8);
    } else
#endif
      _mm256_storeu_ps(top, _mm256_max_ps(hi[0], hi[1]));
  }
};

// Dense blocks (3 or more chunks hold values below the normal range): each chunk's census counted
// in the loop, per lane, by the FP32 patterns of its magnitudes: how many are zero, at most
// to_zero, below subnormal_below (WideBounds' tiny and sub), and the largest: an and, 3
// compares with their adds and a max per column. 32-bit lanes: a round is far below 2^32.
template <int kWidth>
struct ColumnCounts {
  using V = typename ColumnTypes<kWidth>::V;
  using Bits = typename ColumnTypes<kWidth>::Bits;
  static constexpr bool kWide = kWidth == 16;
  static Bits set1(uint32_t v) {
    if constexpr (kWide) return _mm512_set1_epi32(static_cast<int>(v));
    else return _mm256_set1_epi32(static_cast<int>(v));
  }
  void column(V v, int) {
#if defined(BELAY_ISA_avx512)
    if constexpr (kWide) {
      const auto add_if = [](Bits n, __mmask16 m) { return _mm512_mask_sub_epi32(n, m, n, set1(0xffffffffu)); };
      const Bits a = _mm512_and_si512(_mm512_castps_si512(v), mask);
      zero = add_if(zero, _mm512_testn_epi32_mask(a, a));
      tiny = add_if(tiny, _mm512_cmplt_epu32_mask(a, tiny_at));
      sub = add_if(sub, _mm512_cmplt_epu32_mask(a, sub_at));
      hi = _mm512_max_epu32(hi, a);
    } else
#endif
    {  // magnitudes below 2^31: signed compares
      const Bits a = _mm256_and_si256(_mm256_castps_si256(v), mask);
      zero = _mm256_sub_epi32(zero, _mm256_cmpeq_epi32(a, _mm256_setzero_si256()));
      tiny = _mm256_sub_epi32(tiny, _mm256_cmpgt_epi32(tiny_at, a));
      sub = _mm256_sub_epi32(sub, _mm256_cmpgt_epi32(sub_at, a));
      hi = _mm256_max_epu32(hi, a);
    }
  }
  // Bit k: chunk k held a value below the normal range since `sub` was `before`.
  unsigned grew_since(Bits before) const {
#if defined(BELAY_ISA_avx512)
    if constexpr (kWide) {
      const unsigned m = _mm512_cmpneq_epi32_mask(sub, before);
      return (m | m >> 8) & 0xffu;
    } else
#endif
      return ~static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(sub, before)))) & 0xffu;
  }
  explicit ColumnCounts(CensusBounds b)
      : mask(set1(0x7fffffffu)), tiny_at(set1(WideBounds(b, GemmElem::F32).tiny)),
        sub_at(set1(WideBounds(b, GemmElem::F32).sub)) {}
  Bits mask, tiny_at, sub_at, zero = set1(0), tiny = set1(0), sub = set1(0), hi = set1(0);
  // Chunk k's counts, its largest magnitude included, added into counts[k] (its values all finite).
  void into(int lanes, CensusCounts* counts) const {
    constexpr int kLanes = sizeof(Bits) / 4;
    alignas(64) uint32_t z[kLanes], t[kLanes], u[kLanes], h[kLanes];
    std::memcpy(z, &zero, sizeof z), std::memcpy(t, &tiny, sizeof t), std::memcpy(u, &sub, sizeof u);
    std::memcpy(h, &hi, sizeof h);
    for (int k = 0; k < lanes; ++k) {
      uint64_t zk = 0, tk = 0, uk = 0;
      uint32_t hk = 0;
      for (int l = k; l < kLanes; l += 8) zk += z[l], tk += t[l], uk += u[l], hk = h[l] > hk ? h[l] : hk;
      counts[k].zeros += zk;
      counts[k].underflow += tk - zk;
      counts[k].subnormal += uk - tk;
      const float top = f32_from_bits(hk);
      counts[k].amax = top > counts[k].amax ? top : counts[k].amax;
    }
  }
};

// The steps of 8 chunks anywhere (chunk k from x[k], `whole` elements, a multiple of 8) onto
// sums, as add_step sums 8 chunks stride apart: the columns first, then scaled (the same
// products), each column shown to the census on the way. Inlined into the census's block loop:
// the sums stay in a register from block to block (called once a block, the default GPT's
// census without its operations took 1.045x the guard's time, inlined 1.01-1.03x; Zen 4).
template <GemmElem E, class Census>
__attribute__((always_inline)) inline void sum_steps_at(const void* const* x, int64_t j0, int64_t j1, SquareSums& sums_out,
                                                        Census& census_out) {
  SquareSums sums = sums_out;
  Census census = census_out;
  for (int64_t j = j0; j < j1; j += 8) {
#if defined(BELAY_ISA_avx512)
    if constexpr (E == GemmElem::F32) {  // 8 columns of 8 from registers (transpose8), as the guard alone read them
      __m256 r[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(static_cast<const float*>(x[k]) + j);
      transpose8(r);
      for (int c = 0; c < 8; ++c) census.column(r[c], c);
      sums.add_unscaled_columns(r);
    } else {
      __m512 a[4];
      for (int k = 0; k < 4; ++k) a[k] = load16_pair<E>(x[k], j, x[k + 4], j);
      SquareSums::columns16(a);
      for (int c = 0; c < 4; ++c) census.column(a[c], c);
      sums.add_columns16(a);
    }
#else
    __m256 a[8];
    for (int k = 0; k < 4; ++k)
      for (int h = 0; h < 2; ++h) a[k + 4 * h] = load4_pair<E>(x[k], j + 4 * h, x[k + 4], j + 4 * h);
    SquareSums::columns8(a);
    for (int c = 0; c < 8; ++c) census.column(a[c], c);
    sums.add_columns8(a);
#endif
  }
  sums_out = sums;
  census_out = census;
}

SquareSums sums_so_far(const double* out, float inv) {
  SquareSums sums(inv);
#if defined(BELAY_ISA_avx512)
  sums.acc = _mm512_loadu_pd(out);
#else
  sums.lo = _mm256_loadu_pd(out), sums.hi = _mm256_loadu_pd(out + 4);
#endif
  return sums;
}

// Chunks anywhere: steps of 8 elements of each, transposed (each lane its chunk's squares in
// order), onto the sums so far; then the elements past the last whole 8 one by one. FP32 on
// avx512 in 8 columns of 8 from registers (transpose8): columns16's layout took 1.03-1.05x its
// time on the default GPT's gradients (Xeon); FP16 and BF16 in columns16's (0.9x and 0.7x the
// time of 8 columns of 8 there).
template <GemmElem E>
void sum_squares_8_at_of(const void* const* x, int64_t len, float inv, double* out) {
  SquareSums sums = sums_so_far(out, inv);
  const int64_t whole = len / 8 * 8;
  NoColumns none;
  sum_steps_at<E>(x, 0, whole, sums, none);
  sums.store(out);
  for (int k = 0; k < 8; ++k)
    for (int64_t j = whole; j < len; ++j) {
      const float u = grad_at(x[k], E, j) * inv;
      out[k] += (double)u * (double)u;
    }
}

void sum_squares_8_at(const void* const* x, GemmElem elem, int64_t len, float inv, double* out) {
  if (elem == GemmElem::F32) sum_squares_8_at_of<GemmElem::F32>(x, len, inv, out);
  else if (elem == GemmElem::F16) sum_squares_8_at_of<GemmElem::F16>(x, len, inv, out);
  else sum_squares_8_at_of<GemmElem::BF16>(x, len, inv, out);
}

// WideCensus's vectors on the AVX paths (WideCensus and WideBounds: above, shared with the
// baseline path's SSE2 vectors).
#if defined(BELAY_ISA_avx512)
struct WideHalves {  // 32 stored FP16 or BF16 values, counted by saturating arithmetic
  using Vec = __m512i;
  using Lane = uint16_t;
  static constexpr int kDenseVecs = 1;  // vectors per chunk per dense group (census_dense_wide)
  static constexpr bool kSpread = true;  // the dense census spread over the group's steps
  static Vec load(const Lane* p) { return _mm512_loadu_si512(p); }
  static Vec set1(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }
  // a < bound exactly where bound - a (saturating at 0) is at least 1: min(., 1) is the lane's
  // count. No compare into a mask register: those issue on port 5 only, beside the guard's
  // transposition shuffles, where the subtract, min and add may take port 0 as well. On the AMX
  // Xeon (belay_bench --only census, 1 thread, builds alternated, 3 pairs) the FP16 rows took
  // 1.13-1.14x the guard's time against 1.14-1.17x with the mask compares and masked adds.
  static Vec add_below(Vec n, Vec a, Vec bound) {
    return _mm512_add_epi16(n, _mm512_min_epu16(_mm512_subs_epu16(bound, a), set1(1)));
  }
  static Vec add_zero(Vec n, Vec a) { return _mm512_add_epi16(n, _mm512_subs_epu16(set1(1), a)); }  // 1 - a, at least 0
  static Vec max(Vec a, Vec b) { return _mm512_max_epu16(a, b); }
};
struct WideFloats {  // 16 FP32 values
  using Vec = __m512i;
  using Lane = uint32_t;
  static Vec load(const Lane* p) { return _mm512_loadu_si512(p); }
  static Vec set1(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
  static Vec add_below(Vec n, Vec a, Vec bound) {
    return _mm512_mask_add_epi32(n, _mm512_cmplt_epu32_mask(a, bound), n, set1(1));
  }
  static Vec add_zero(Vec n, Vec a) { return _mm512_mask_add_epi32(n, _mm512_testn_epi32_mask(a, a), n, set1(1)); }
};
#else
struct WideHalves {  // 16 stored FP16 or BF16 values; magnitudes fit a signed compare
  using Vec = __m256i;
  using Lane = uint16_t;
  static constexpr int kDenseVecs = 2;
  static constexpr bool kSpread = true;  // flagged 1.04-1.05x against 1.20-1.21x
  static Vec load(const Lane* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vec set1(uint32_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }
  static Vec add_below(Vec n, Vec a, Vec bound) { return _mm256_sub_epi16(n, _mm256_cmpgt_epi16(bound, a)); }
  static Vec add_zero(Vec n, Vec a) { return _mm256_sub_epi16(n, _mm256_cmpeq_epi16(a, _mm256_setzero_si256())); }
  static Vec max(Vec a, Vec b) { return _mm256_max_epu16(a, b); }
};
struct WideFloats {  // 8 FP32 values
  using Vec = __m256i;
  using Lane = uint32_t;
  static Vec load(const Lane* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vec set1(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static Vec add_below(Vec n, Vec a, Vec bound) { return _mm256_sub_epi32(n, _mm256_cmpgt_epi32(bound, a)); }
  static Vec add_zero(Vec n, Vec a) { return _mm256_sub_epi32(n, _mm256_cmpeq_epi32(a, _mm256_setzero_si256())); }
};
#endif

// The census of a call's flagged blocks, chunk by chunk: a block of chunk k that held a value
// below the normal range is counted again from L1 into chunk k's lane counters (this path's
// vectors for the stored format), summed into its counts once, at the end of the call, where
// census_finite per block built a WideCensus and summed its lanes each time. With an exact zero
// every 1021 values (most blocks flagged) the batched census of 8 x 16384 FP32 values in L2 took
// 1.33-1.36x the guard's time on Zen 3 (avx2) against 1.64-1.70x (this with the dense switch and
// the sums' registers, same commit).
template <class W>
struct ChunkRecounts {
  using Vec = typename W::Vec;
  using Lane = typename W::Lane;
  static constexpr int kLanes = sizeof(Vec) / sizeof(Lane);
  static constexpr int64_t kFlushAt = 32768;  // vectors a chunk's 16-bit lanes take before they could wrap
  CensusBounds bounds;
  GemmElem elem;
  Vec mask, tiny_at, sub_at;
  Vec zero[8], tiny[8], sub[8];  // per chunk, lane counts of magnitudes below 1, tiny and sub
  int64_t vectors[8] = {};
  uint64_t total[8][3] = {};
  unsigned used = 0;
  ChunkRecounts(CensusBounds b, GemmElem e) : bounds(b), elem(e) {
    const WideBounds wb(b, e);
    mask = W::set1(e == GemmElem::F32 ? 0x7fffffffu : 0x7fffu), tiny_at = W::set1(wb.tiny), sub_at = W::set1(wb.sub);
    for (int k = 0; k < 8; ++k) zero[k] = tiny[k] = sub[k] = W::set1(0);
  }
  // n values of chunk k from p on.
  void add(int k, const void* p, int64_t n, CensusCounts* counts) {
    const int64_t whole = n / kLanes * kLanes;
    const Lane* q = static_cast<const Lane*>(p);
    Vec z = zero[k], t = tiny[k], u = sub[k];  // in registers for the loop
    for (int64_t j = 0; j < whole; j += kLanes) {
      const Vec a = W::load(q + j) & mask;
      z = W::add_zero(z, a), t = W::add_below(t, a, tiny_at), u = W::add_below(u, a, sub_at);
    }
    zero[k] = z, tiny[k] = t, sub[k] = u;
    if ((vectors[k] += whole / kLanes) >= kFlushAt) flush(k);
    for (int64_t j = whole; j < n; ++j) {
      const float v = grad_at(p, elem, j);
      counts->add(census_class(v, bounds), v);
    }
    used |= 1u << k;
  }
  void flush(int k) {
    const Vec* n[3] = {&zero[k], &tiny[k], &sub[k]};
    for (int i = 0; i < 3; ++i) {
      Lane l[kLanes];
      std::memcpy(l, n[i], sizeof l);
      for (const Lane c : l) total[k][i] += c;
    }
    zero[k] = tiny[k] = sub[k] = W::set1(0);
    vectors[k] = 0;
  }
  // The counts of chunk k into counts[k] (the largest magnitudes are the caller's).
  void into(CensusCounts* counts) {
    for (int k = 0; k < 8; ++k)
      if (used >> k & 1u) {
        flush(k);
        counts[k].zeros += total[k][0];
        counts[k].underflow += total[k][1] - total[k][0];
        counts[k].subnormal += total[k][2] - total[k][1];
      }
  }
};

// The elements [whole, len) of the 8 chunks, one by one: squares onto out[k], and for the first
// `lanes` chunks their census into counts[k].
void census_tail(const void* const* x, int lanes, GemmElem elem, int64_t whole, int64_t len, float inv, CensusBounds b,
                 double* out, CensusCounts* counts) {
  for (int k = 0; k < 8; ++k)
    for (int64_t j = whole; j < len; ++j) {
      const float v = grad_at(x[k], elem, j), u = v * inv;
      out[k] += (double)u * (double)u;
      if (k < lanes) counts[k].add(census_class(v, b), v);
    }
}

// sum_squares_8_at's sums, the same bits, and in the same read the census of the first `lanes`
// chunks into counts[0, lanes), which start at zero (the other lanes repeat a chunk: summed,
// not counted). Blocks of kBlock values of each chunk: in a plain block the columns fold each
// chunk's smallest and largest magnitude (Magnitudes), and a chunk that held a value below the
// normal range has its block counted again from L1 (ChunkRecounts); in the block after one
// where 3 or more chunks did (or the first, where the caller says `dense`), every chunk is
// counted in the loop instead (ColumnCounts), and the blocks after it go back to the scan when
// fewer than 3 chunks' counts grew in it. A chunk whose sum is not finite (an inf or a NaN, which
// the compares pass over) is counted again in full (census_run). Returns how many chunks held
// a value off the normal finite range: the caller's hint for its next round.
template <GemmElem E>
int sum_squares_census_8_at_of(const void* const* x, int lanes, int64_t len, float inv, CensusBounds b, bool dense,
                               double* out, CensusCounts* counts) {
  using W = std::conditional_t<E == GemmElem::F32, WideFloats, WideHalves>;
#if defined(BELAY_ISA_avx512)
  constexpr int kWidth = E == GemmElem::F32 ? 8 : 16;  // sum_steps_at's columns
#else
  constexpr int kWidth = 8;
#endif
  constexpr GemmElem elem = E;
  constexpr int64_t kBlock = 128;
  constexpr int kDenseChunks = 3;
  constexpr int64_t elem_bytes = elem == GemmElem::F32 ? 4 : 2;
  SquareSums sums = sums_so_far(out, inv);
  const int64_t whole = len / 8 * 8;
  Magnitudes<kWidth> plain;
  ColumnCounts<kWidth> counted(b);
  const unsigned live = (1u << lanes) - 1;
  unsigned flagged = 0;
  ChunkRecounts<W> recounts(b, elem);
  for (int64_t j = 0; j < whole; j += kBlock) {
    const int64_t end = std::min(whole, j + kBlock);
    unsigned below = 0;
    if (dense) {
      const typename ColumnTypes<kWidth>::Bits before = counted.sub;
      sum_steps_at<E>(x, j, end, sums, counted);
      below = counted.grew_since(before) & live;
    } else {
      sum_steps_at<E>(x, j, end, sums, plain);
      below = plain.below(b.subnormal_below) & live;
      for (unsigned m = below; m != 0; m &= m - 1) {  // the flagged chunks only (a branch per lane mispredicted)
        const int k = __builtin_ctz(m);
        recounts.add(k, static_cast<const char*>(x[k]) + j * elem_bytes, end - j, &counts[k]);
      }
    }
    flagged |= below;
    dense = __builtin_popcount(below) >= kDenseChunks;
  }
  sums.store(out);
  recounts.into(counts);
  CensusCounts in_loop[8];
  counted.into(lanes, in_loop);
  alignas(32) float top[8];
  plain.largest(top);
  for (int k = 0; k < lanes && whole > 0; ++k) {
    if (!std::isfinite(out[k])) {
      counts[k] = CensusCounts{};
      census_run(x[k], elem, whole, b, &counts[k]);  // every value classified
      flagged |= 1u << k;
      continue;
    }
    counts[k].merge(in_loop[k]);
    counts[k].amax = top[k] > counts[k].amax ? top[k] : counts[k].amax;
    const CensusCounts& c = in_loop[k];
    if (c.zeros + c.underflow + c.subnormal > 0) flagged |= 1u << k;
  }
  census_tail(x, lanes, elem, whole, len, inv, b, out, counts);
  return __builtin_popcount(flagged);
}

int sum_squares_census_8_at(const void* const* x, int lanes, GemmElem elem, int64_t len, float inv, CensusBounds b,
                            bool dense, double* out, CensusCounts* counts) {
  if (elem == GemmElem::F32) return sum_squares_census_8_at_of<GemmElem::F32>(x, lanes, len, inv, b, dense, out, counts);
  if (elem == GemmElem::F16) return sum_squares_census_8_at_of<GemmElem::F16>(x, lanes, len, inv, b, dense, out, counts);
  return sum_squares_census_8_at_of<GemmElem::BF16>(x, lanes, len, inv, b, dense, out, counts);
}
constexpr int64_t kCensusRound = INT64_MAX;  // counted in the loop: rounds as long as the chunks

// Dense: the guard's steps as sum_squares_8 takes them (the same bits), and every group of
// WideCensus's kSteps steps counted by it after they are summed. A group of 4 steps (32 values
// of each chunk) measured best but on avx2's FP32 (1 step; 2 took the flagged row from 1.18x to
// 1.25x): from 2 to 4 steps took avx512's FP32 row from 1.21x to 1.13x, avx2's FP16 one from
// 1.21x to 1.18x (means of 4 runs under load). The element type E is a constant (load8 without
// a branch on it per step: 3-4% off the FP16 rows). Not inlined: inlined into its caller, the
// same avx2 FP32 loop ran at 1.2x or 1.4-1.6x the guard's time from one unrelated change to
// another.
template <class W, GemmElem E, int kBounds>
__attribute__((noinline)) void census_dense_wide(const void* x, int64_t stride, int64_t len, float inv,
                                                 CensusBounds b, double* out, CensusCounts* counts) {
  constexpr GemmElem elem = E;
  WideCensus<W, kBounds, W::kDenseVecs> census(WideBounds(b, elem), elem);
  SquareSums sums(inv);
  for (int64_t j = 0; j < len; j += 8 * census.kSteps) {
    // W::kSpread: the group's census split among its steps, a few chunks after each (its
    // burst of operations no longer holds up the sums' chain of adds behind it).
    constexpr int kChunksPerStep = 8 / census.kSteps;
    for (int s = 0; s < census.kSteps; ++s) {
      prefetch_step(x, elem, stride, j + 8 * s);
      sums.template add_step<E>(x, stride, j + 8 * s);
      if constexpr (W::kSpread) census.add_chunks(x, stride, j, s * kChunksPerStep, (s + 1) * kChunksPerStep);
    }
    if constexpr (!W::kSpread) census.add_chunks(x, stride, j, 0, 8);
    census.end_group();
  }
  if (!sums.store(out)) return census_all(x, elem, stride, len, b, counts);
  census.into(counts);
}

template <class W, GemmElem E>
void census_dense_bounds(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                         CensusCounts* counts) {
  const int distinct = WideBounds(b, E).distinct();
  if (distinct == 1) census_dense_wide<W, E, 1>(x, stride, len, inv, b, out, counts);
  else if (distinct == 2) census_dense_wide<W, E, 2>(x, stride, len, inv, b, out, counts);
  else census_dense_wide<W, E, 3>(x, stride, len, inv, b, out, counts);
}

// The widest dense loop this path has for elem (len: a multiple of its group's values).
void census_dense_widest(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, CensusBounds b,
                         double* out, CensusCounts* counts) {
  if (elem != GemmElem::F32 && len % (8 * WideCensus<WideHalves, 1, WideHalves::kDenseVecs>::kSteps) == 0) {
    if (elem == GemmElem::F16)
      return census_dense_bounds<WideHalves, GemmElem::F16>(x, stride, len, inv, b, out, counts);
    return census_dense_bounds<WideHalves, GemmElem::BF16>(x, stride, len, inv, b, out, counts);
  }
  // Another len (the guard's calls all take kReduceChunk): the sums, then every value classified.
  sum_squares_8(x, elem, stride, len, inv, out);
  census_all(x, elem, stride, len, b, counts);
}

// What a sparse loop found, counted: the dirty steps' lane counts and the plain steps' amax,
// or, where the sums are not finite (an inf or NaN passed the scans unseen), the whole call
// counted again in full (census_all).
void finish_sparse(const void* x, GemmElem elem, int64_t stride, int64_t len, CensusBounds b, bool finite,
                   CensusLanes& dirty, uint64_t dirty_values, __m256 amax, CensusCounts* counts) {
  if (!finite) return census_all(x, elem, stride, len, b, counts);
  // No inf and no NaN: the plain steps' values are all normal and finite, so only the dirty
  // steps add counts, and the amax is the larger of the two maxima.
  dirty.amax = _mm256_max_ps(dirty.amax, amax);
  add_census_lanes(dirty, dirty_values, counts);
}

// Sparse: where the values are plain, only each step's min and max of magnitudes (3
// operations per 8 values, 2 with vrangeps); a step whose min is below the normal range (an
// exact zero, a flush, a subnormal) is classified in full (census_step). Infs and NaNs pass
// the min and max unseen, but they make the sums non-finite (finish_sparse).
void census_sparse(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                   CensusCounts* counts) {
  CensusLanes dirty;
  uint64_t dirty_values = 0;
  __m256 amax = _mm256_setzero_ps();
  SquareSums sums(inv);
  for (int64_t j = 0; j < len; j += 8) {
    prefetch_step(x, elem, stride, j);
    __m256 r[8];
    const bool below = any_below(step_min_max(x, elem, stride, j, inv, r, &amax), b);
    sums.add(r);
    if (below) {  // after the sums, where r is dead: the call spills less
      census_step(x, elem, stride, j, b, &dirty);
      dirty_values += 64;
    }
  }
  finish_sparse(x, elem, stride, len, b, sums.store(out), dirty, dirty_values, amax, counts);
}

// ---- Wider scans for the sparse loop ---------------------------------------------------------
// The guard's loads are 8 values wide (its transposition keeps each chunk's sum in order);
// a scan reads kSteps steps of every chunk again, from L1, in wider operations, and says which
// of those steps hold a value below the normal range: 16 (avx2) and 32 (avx512) stored 16-bit
// values per integer min and max, as the bit patterns of magnitudes order as the values do.
// Fewer operations per value than the fused 8-wide min and max of step_min_max. (FP32 calls go
// through the batch loop instead: census_8_as_batch.)

// The 16-bit values as magnitudes: kSteps steps per scan, the largest pattern seen kept.
struct ScanHalves {
#if defined(BELAY_ISA_avx512)
  static constexpr int kSteps = 4;
  using Vec = __m512i;
  static Vec load(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static Vec set1(uint16_t h) { return _mm512_set1_epi16(static_cast<short>(h)); }
  static Vec magnitude(Vec v) { return _mm512_and_si512(v, set1(0x7fff)); }
  static Vec min(Vec a, Vec b) { return _mm512_min_epu16(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_epu16(a, b); }
  static bool any_below(Vec lo, Vec bound) { return _mm512_cmplt_epu16_mask(lo, bound) != 0; }
#else
  static constexpr int kSteps = 2;
  using Vec = __m256i;
  static Vec load(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vec set1(uint16_t h) { return _mm256_set1_epi16(static_cast<short>(h)); }
  static Vec magnitude(Vec v) { return _mm256_and_si256(v, set1(0x7fff)); }
  static Vec min(Vec a, Vec b) { return _mm256_min_epu16(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_epu16(a, b); }
  // Magnitudes fit a signed 16-bit compare.
  static bool any_below(Vec lo, Vec bound) { return _mm256_movemask_epi8(_mm256_cmpgt_epi16(bound, lo)) != 0; }
#endif
  GemmElem elem;
  Vec bound, hi = set1(0);
  ScanHalves(CensusBounds b, GemmElem e) : elem(e), bound(set1(first_bits_at_least(b.subnormal_below, e))) {}

  // Whether the group from j on holds a value below the normal range (a NaN or inf: caught by
  // the sums).
  bool next(const void* x, int64_t stride, int64_t j) {
    const uint16_t* p = static_cast<const uint16_t*>(x);
    Vec lo = set1(0x7fff);
    for (int k = 0; k < 8; ++k) {
      const Vec a = magnitude(load(p + k * stride + j));
      lo = min(lo, a);
      hi = max(hi, a);
    }
    return any_below(lo, bound);
  }
  // The largest magnitude seen, as FP32 (an inf or NaN pattern only where the sums are not finite).
  __m256 amax() const {
    alignas(64) uint16_t lanes[sizeof(Vec) / 2];
    std::memcpy(lanes, &hi, sizeof hi);
    uint16_t top = 0;
    for (const uint16_t h : lanes) top = h > top ? h : top;
    return _mm256_set1_ps(elem == GemmElem::F16 ? f16_bits_to_f32(top) : bf16_bits_to_f32(top));
  }
};

// The sparse loop on a wider scan: the guard's steps as in census_sparse, the census's
// min and max taken by Scan once per group of Scan::kSteps steps, and a group that holds a
// value below the normal range classified whole by WideCensus (the same group of steps:
// fewer operations than census_step on each of its dirty steps, and no call). E: a constant,
// as in census_dense_wide.
template <class Scan, class W, GemmElem E, int kBounds>
void census_sparse_scanned(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                           CensusCounts* counts) {
  constexpr GemmElem elem = E;
  static_assert(Scan::kSteps == WideCensus<W, kBounds>::kSteps, "a scan's group is the census's");
  Scan scan(b, elem);
  WideCensus<W, kBounds> dirty(WideBounds(b, elem), elem);
  SquareSums sums(inv);
  for (int64_t j = 0; j < len; j += 8 * Scan::kSteps) {
    // A flagged group counted before the guard's steps, while the scan's vectors are still in
    // registers (after them, a compiler kept every group's vectors on the stack for it).
    if (scan.next(x, stride, j)) dirty.add(x, stride, j);
    for (int s = 0; s < Scan::kSteps; ++s) {
      prefetch_step(x, elem, stride, j + 8 * s);
      sums.template add_step<E>(x, stride, j + 8 * s);
    }
  }
  if (!sums.store(out)) return census_all(x, elem, stride, len, b, counts);
  // No inf and no NaN: the plain groups' values are all normal, so only the dirty groups add
  // counts, and the amax is the scan's (every value's).
  dirty.into(counts);
  const float amax = _mm256_cvtss_f32(scan.amax());
  counts->amax = amax > counts->amax ? amax : counts->amax;
}

template <class Scan, class W, GemmElem E>
void census_sparse_bounds(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                          CensusCounts* counts) {
  const int distinct = WideBounds(b, E).distinct();
  if (distinct == 1) census_sparse_scanned<Scan, W, E, 1>(x, stride, len, inv, b, out, counts);
  else if (distinct == 2) census_sparse_scanned<Scan, W, E, 2>(x, stride, len, inv, b, out, counts);
  else census_sparse_scanned<Scan, W, E, 3>(x, stride, len, inv, b, out, counts);
}

// The widest sparse loop this path has for elem.
void census_sparse_widest(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, CensusBounds b,
                          double* out, CensusCounts* counts) {
  if (elem != GemmElem::F32 && len % (8 * ScanHalves::kSteps) == 0) {
    if (elem == GemmElem::F16)
      return census_sparse_bounds<ScanHalves, WideHalves, GemmElem::F16>(x, stride, len, inv, b, out, counts);
    return census_sparse_bounds<ScanHalves, WideHalves, GemmElem::BF16>(x, stride, len, inv, b, out, counts);
  }
  census_sparse(x, elem, stride, len, inv, b, out, counts);
}

// FP32: the 8 chunks stride apart as a batch's 8 chunks anywhere (sum_squares_census_8_at: the
// sums in the same order, the same bits), their counts added up. On avx2 its columns8 steps and
// per-block scan took the census from 1.50-1.65x the guard's time to 1.04-1.11x (Zen 3, 8 x
// 16384 values in L2, no value below the normal range; 1.23-1.34x against 1.53-1.68x with an
// exact zero every 1021 values) against census_sparse's 8 x 8 transposition and per-step test;
// from memory (belay_bench --only census) 1.09-1.18x against 1.09-1.26x, alike within the
// host's noise. On avx512 (8 columns of 8, vrangeps on each) from memory, Zen 4: 1.04-1.08x
// either way with no value below the normal range, 1.14-1.21x against 1.35-1.41x (the scan of 16
// values a vrangeps and WideCensus's dense groups) where every step holds some.
void census_8_as_batch(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                       CensusCounts* counts) {
  const void* at[8];
  for (int k = 0; k < 8; ++k) at[k] = static_cast<const float*>(x) + k * stride, out[k] = 0.0;
  CensusCounts each[8];
  sum_squares_census_8_at_of<GemmElem::F32>(at, 8, len, inv, b, false, out, each);
  for (const CensusCounts& c : each) counts->merge(c);
}

// The guard's sums (sum_squares_8's, the same bits) and the census in the same read. FP32 as a
// batch (above); for 16-bit buffers the loop is chosen per call (8 x len values of one tensor,
// mostly alike) from its first 8 steps: sparse when at most 2 of them hold a value below the normal range, dense otherwise
// (where most steps are flagged, sparse would pay for both). Both count the same.
void sum_squares_census_8(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, CensusBounds b,
                          double* out, CensusCounts* counts) {
  if (elem == GemmElem::F32) return census_8_as_batch(x, stride, len, inv, b, out, counts);
  int flagged = 0;
  __m256 ignored = _mm256_setzero_ps();
  for (int64_t j = 0; j < std::min<int64_t>(len, 64); j += 8) {
    __m256 r[8];
    flagged += any_below(step_min_max(x, elem, stride, j, inv, r, &ignored), b) ? 1 : 0;
  }
  if (flagged <= 2) census_sparse_widest(x, elem, stride, len, inv, b, out, counts);
  else census_dense_widest(x, elem, stride, len, inv, b, out, counts);
}
#else
template <GemmElem Elem>
void sum_squares_8_of(const void* x, int64_t stride, int64_t len, float inv, double* out) {
  double acc[8] = {};
  for (int64_t j = 0; j < len; ++j)
    for (int k = 0; k < 8; ++k) {
      const float u = grad_at(x, Elem, k * stride + j) * inv;
      acc[k] += (double)u * (double)u;
    }
  for (int k = 0; k < 8; ++k) out[k] = acc[k];
}

// One loop per element type (the type's test hoisted out of the loop).
void sum_squares_8(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, double* out) {
  if (elem == GemmElem::F32) sum_squares_8_of<GemmElem::F32>(x, stride, len, inv, out);
  else if (elem == GemmElem::F16) sum_squares_8_of<GemmElem::F16>(x, stride, len, inv, out);
  else sum_squares_8_of<GemmElem::BF16>(x, stride, len, inv, out);
}

template <GemmElem Elem>
void sum_squares_8_at_of(const void* const* x, int64_t len, float inv, double* out) {
  double acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = out[k];  // onto the sums so far
  for (int64_t j = 0; j < len; ++j)
    for (int k = 0; k < 8; ++k) {
      const float u = grad_at(x[k], Elem, j) * inv;
      acc[k] += (double)u * (double)u;
    }
  for (int k = 0; k < 8; ++k) out[k] = acc[k];
}

void sum_squares_8_at(const void* const* x, GemmElem elem, int64_t len, float inv, double* out) {
  if (elem == GemmElem::F32) sum_squares_8_at_of<GemmElem::F32>(x, len, inv, out);
  else if (elem == GemmElem::F16) sum_squares_8_at_of<GemmElem::F16>(x, len, inv, out);
  else sum_squares_8_at_of<GemmElem::BF16>(x, len, inv, out);
}

// Whether the first n values (a multiple of 8) are all normal and finite, as the AVX paths'
// all_normal, on SSE2: FP32 magnitudes by float min and max (which pass a NaN over, so NaNs
// are looked for apart), 16-bit ones by signed min and max (they fit below 2^15).
bool all_normal_f32(const float* p, int64_t n, CensusBounds b, float* amax) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  // Two chains of each (a min or max waits 4 cycles for the one before: one chain alone held
  // the scan to a value a cycle, 1.5x the guard's time on the default GPT's gradients).
  __m128 lo = _mm_set1_ps(3.40282347e38f), hi = _mm_setzero_ps(), nan = _mm_setzero_ps();
  __m128 lo2 = lo, hi2 = hi;
  for (int64_t j = 0; j < n; j += 8) {
    const __m128 a = _mm_and_ps(_mm_loadu_ps(p + j), abs_mask), c = _mm_and_ps(_mm_loadu_ps(p + j + 4), abs_mask);
    lo = _mm_min_ps(a, lo), lo2 = _mm_min_ps(c, lo2);
    hi = _mm_max_ps(a, hi), hi2 = _mm_max_ps(c, hi2);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(a, c));  // true where either is NaN
  }
  lo = _mm_min_ps(lo, lo2), hi = _mm_max_ps(hi, hi2);
  alignas(16) float l[4], h[4];
  _mm_store_ps(l, lo), _mm_store_ps(h, hi);
  float low = l[0], top = h[0];
  for (int k = 1; k < 4; ++k) low = l[k] < low ? l[k] : low, top = h[k] > top ? h[k] : top;
  if (_mm_movemask_ps(nan) != 0 || low < b.subnormal_below || !(top <= 3.40282347e38f)) return false;
  *amax = top;
  return true;
}

bool all_normal(const void* x, GemmElem elem, int64_t n, CensusBounds b, float* amax) {
  if (elem == GemmElem::F32) return all_normal_f32(static_cast<const float*>(x), n, b, amax);
  const uint16_t* p = static_cast<const uint16_t*>(x);
  const __m128i mask = _mm_set1_epi16(0x7fff);
  __m128i lo = mask, hi = _mm_setzero_si128();
  for (int64_t j = 0; j < n; j += 8) {
    const __m128i a = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j)), mask);
    lo = _mm_min_epi16(lo, a);
    hi = _mm_max_epi16(hi, a);
  }
  alignas(16) uint16_t l[8], h[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(l), lo), _mm_store_si128(reinterpret_cast<__m128i*>(h), hi);
  uint16_t low = l[0], top = h[0];
  for (int k = 1; k < 8; ++k) low = l[k] < low ? l[k] : low, top = h[k] > top ? h[k] : top;
  if (low < first_bits_at_least(b.subnormal_below, elem) || top >= (elem == GemmElem::F16 ? 0x7c00u : 0x7f80u))
    return false;
  *amax = elem == GemmElem::F16 ? f16_bits_to_f32(top) : bf16_bits_to_f32(top);
  return true;
}

// As the AVX paths': the values all normal and finite counted by their largest alone, else
// each classified.
void census_run(const void* x, GemmElem elem, int64_t n, CensusBounds b, CensusCounts* counts) {
  const int64_t scanned = n / 8 * 8;
  float top = 0.0f;
  int64_t j = 0;
  if (scanned > 0 && all_normal(x, elem, scanned, b, &top)) {
    counts->amax = top > counts->amax ? top : counts->amax;
    j = scanned;
  }
  for (; j < n; ++j) {
    const float v = grad_at(x, elem, j);
    counts->add(census_class(v, b), v);
  }
}


// The census classes counted per chunk lane, as the AVX paths' CensusLanes, in plain arrays
// the vectorizer widens (comparisons as 0 or 1, no branch; a NaN fails every one).
struct CensusLaneCounts {
  uint32_t finite[8] = {}, tiny[8] = {}, sub[8] = {}, zero[8] = {};
  float amax[8] = {};
  void add(int k, float v, CensusBounds b) {
    const float a = std::fabs(v);
    const bool fin = a <= 3.40282347e38f;
    finite[k] += fin ? 1u : 0u;
    tiny[k] += a <= b.to_zero ? 1u : 0u;
    sub[k] += a < b.subnormal_below ? 1u : 0u;
    zero[k] += a == 0.0f ? 1u : 0u;
    amax[k] = fin && a > amax[k] ? a : amax[k];
  }
  // The counts of `seen` values, added into *counts as census classes.
  void into(uint64_t seen, CensusCounts* counts) const {
    uint64_t f = 0, t = 0, s = 0, z = 0;
    for (int k = 0; k < 8; ++k) {
      f += finite[k];
      t += tiny[k];
      s += sub[k];
      z += zero[k];
      counts->amax = std::max(counts->amax, amax[k]);
    }
    counts->nonfinite += seen - f;
    counts->zeros += z;
    counts->underflow += t - z;
    counts->subnormal += s - t;
  }
};

// Every value classified where it is summed, finiteness too, in lane counters the vectorizer
// widens: the recount of a call whose sums are not finite (an inf or NaN passed the loops
// below, which take the values as finite), and a call of another length.
template <GemmElem Elem>
void census_full_of(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                     CensusCounts* counts) {
  double acc[8] = {};
  CensusLaneCounts c;
  for (int64_t j = 0; j < len; ++j)
    for (int k = 0; k < 8; ++k) {
      const float v = grad_at(x, Elem, k * stride + j);
      c.add(k, v, b);
      const float u = v * inv;
      acc[k] += (double)u * (double)u;
    }
  for (int k = 0; k < 8; ++k) out[k] = acc[k];
  c.into(static_cast<uint64_t>(len) * 8, counts);
}

// The sparse loop's scan on SSE2 (every x86-64 CPU has it): whether a step of kStepValues
// values of each of the 8 chunks holds a magnitude below the normal range, by a min and max
// per vector (4 FP32 values, or 8 stored 16-bit values taken as integer magnitudes, whose
// patterns order as their values: SSE2's signed 16-bit min and max suffice below 0x8000).
// NaNs and infs pass it (the sums then are not finite: the call is counted again in full).
constexpr int64_t kStepValues = 8;

struct ScanStepSse2 {
  GemmElem elem;
  float bound;
  __m128i bound16, hi16 = _mm_setzero_si128();
  __m128 hi32 = _mm_setzero_ps();
  ScanStepSse2(CensusBounds b, GemmElem e)
      : elem(e), bound(b.subnormal_below),
        bound16(_mm_set1_epi16(static_cast<short>(e == GemmElem::F32 ? 0 : first_bits_at_least(bound, e)))) {}

  bool below(const void* x, int64_t stride, int64_t j) {
    if (elem == GemmElem::F32) {
      const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
      __m128 lo = _mm_set1_ps(3.40282347e38f);
      for (int k = 0; k < 8; ++k)
        for (int q = 0; q < kStepValues; q += 4) {
          const __m128 a = _mm_and_ps(_mm_loadu_ps(static_cast<const float*>(x) + k * stride + j + q), abs_mask);
          lo = _mm_min_ps(a, lo);
          hi32 = _mm_max_ps(a, hi32);
        }
      return _mm_movemask_ps(_mm_cmplt_ps(lo, _mm_set1_ps(bound))) != 0;
    }
    const __m128i mask = _mm_set1_epi16(0x7fff);
    __m128i lo = mask;
    for (int k = 0; k < 8; ++k) {
      const __m128i a = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + k * stride + j)), mask);
      lo = _mm_min_epi16(lo, a);
      hi16 = _mm_max_epi16(hi16, a);
    }
    return _mm_movemask_epi8(_mm_cmplt_epi16(lo, bound16)) != 0;
  }
  // The largest magnitude scanned, as FP32 (meaningful where the sums are finite).
  float amax() const {
    float top = 0.0f;
    if (elem == GemmElem::F32) {
      alignas(16) float l[4];
      _mm_store_ps(l, hi32);
      for (const float v : l) top = v > top ? v : top;
      return top;
    }
    alignas(16) uint16_t l[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(l), hi16);
    uint16_t h = 0;
    for (const uint16_t v : l) h = v > h ? v : h;
    return elem == GemmElem::F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
  }
};

// WideCensus on SSE2, one step (kStepValues values of each chunk) per group: 8 stored 16-bit
// values per vector, or 4 FP32 values (two vectors per chunk), as integer magnitudes. They
// fit SSE2's signed compares (below 2^15 and 2^31). SSE2 has no 32-bit integer max, so the
// FP32 amax is a float max of the magnitudes (finite ones order alike as floats and as
// integers; an inf or NaN only where the sums are not finite, and the call is then counted
// again in full). Where every value is classified this takes 6 operations per 8 stored
// 16-bit values (in their own format) and 8 per 4 FP32 values, on integer lanes, where
// census_full_of classified each value in floats after building its vectors from scalar loads.
struct WideHalves {
  using Vec = __m128i;
  using Lane = uint16_t;
  static constexpr int kDenseVecs = 1;
  static Vec load(const Lane* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static Vec set1(uint32_t v) { return _mm_set1_epi16(static_cast<short>(v)); }
  static Vec add_below(Vec n, Vec a, Vec bound) { return _mm_sub_epi16(n, _mm_cmplt_epi16(a, bound)); }
  static Vec add_zero(Vec n, Vec a) { return _mm_sub_epi16(n, _mm_cmpeq_epi16(a, _mm_setzero_si128())); }
  static Vec max(Vec a, Vec b) { return _mm_max_epi16(a, b); }
};
struct WideFloats {
  using Vec = __m128i;
  using Lane = uint32_t;
  static constexpr int kDenseVecs = 2;
  static Vec load(const Lane* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static Vec set1(uint32_t v) { return _mm_set1_epi32(static_cast<int>(v)); }
  static Vec add_below(Vec n, Vec a, Vec bound) { return _mm_sub_epi32(n, _mm_cmplt_epi32(a, bound)); }
  static Vec add_zero(Vec n, Vec a) { return _mm_sub_epi32(n, _mm_cmpeq_epi32(a, _mm_setzero_si128())); }
  static Vec max(Vec a, Vec b) { return _mm_castps_si128(_mm_max_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b))); }
};

// census_finite_bounds with this path's vectors for elem.
void census_finite(const void* x, GemmElem elem, int64_t n, CensusBounds b, CensusCounts* counts) {
  if (elem == GemmElem::F32) census_finite_bounds<WideFloats>(x, elem, n, b, counts);
  else census_finite_bounds<WideHalves>(x, elem, n, b, counts);
}

template <GemmElem Elem, int kBounds>
using StepCensus = WideCensus<std::conditional_t<Elem == GemmElem::F32, WideFloats, WideHalves>, kBounds,
                              Elem == GemmElem::F32 ? WideFloats::kDenseVecs : WideHalves::kDenseVecs>;

constexpr int64_t kCensusRound = 1024;  // each round's chunks counted again after its sums, from L1

// As the AVX paths' entry (counts[0, lanes) start at zero), the census after the sums: a chunk
// all normal and finite by its largest alone (all_normal's scan), one whose sum is finite
// counted by census_finite, any other classified value by value (census_run). Not
// dense: one way here.
int sum_squares_census_8_at(const void* const* x, int lanes, GemmElem elem, int64_t len, float inv, CensusBounds b,
                            bool, double* out, CensusCounts* counts) {
  sum_squares_8_at(x, elem, len, inv, out);
  const int64_t scanned = len / 8 * 8;
  int flagged = 0;
  for (int k = 0; k < lanes; ++k) {
    CensusCounts& c = counts[k];
    float top = 0.0f;
    if (!std::isfinite(out[k])) {
      census_run(x[k], elem, len, b, &c);
    } else if (scanned > 0 && all_normal(x[k], elem, scanned, b, &top)) {
      c.amax = top > c.amax ? top : c.amax;
      for (int64_t j = scanned; j < len; ++j) {
        const float v = grad_at(x[k], elem, j);
        c.add(census_class(v, b), v);
      }
    } else {
      census_finite(x[k], elem, len, b, &c);
    }
    flagged += c.nonfinite + c.zeros + c.underflow + c.subnormal > 0 ? 1 : 0;
  }
  return flagged;
}

// One step of the guard's sums: values j0 .. j0 + kStepValues - 1 of each chunk added into
// acc, in each chunk's order (sum_squares_8_of's operations: the same bits).
template <GemmElem Elem>
inline void sum_step_of(const void* x, int64_t stride, int64_t j0, float inv, double* acc) {
  for (int64_t j = j0; j < j0 + kStepValues; ++j)
    for (int k = 0; k < 8; ++k) {
      const float u = grad_at(x, Elem, k * stride + j) * inv;
      acc[k] += (double)u * (double)u;
    }
}

// Writes the 8 sums; true when all are finite.
inline bool store_sums(const double* acc, double* out) {
  bool finite = true;
  for (int k = 0; k < 8; ++k) {
    out[k] = acc[k];
    finite = finite && std::isfinite(acc[k]);
  }
  return finite;
}

// Dense: every step summed, then classified by StepCensus from L1.
template <GemmElem Elem, int kBounds>
void census_dense_of(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                     CensusCounts* counts) {
  static_assert(StepCensus<Elem, kBounds>::kSteps == 1, "a census group is one step");
  double acc[8] = {};
  StepCensus<Elem, kBounds> census(WideBounds(b, Elem), Elem);
  for (int64_t j0 = 0; j0 < len; j0 += kStepValues) {
    sum_step_of<Elem>(x, stride, j0, inv, acc);
    census.add(x, stride, j0);
  }
  if (!store_sums(acc, out)) return census_full_of<Elem>(x, stride, len, inv, b, out, counts);  // the same sums again
  census.into(counts);
}

// Sparse: the guard's sums as in the dense loop, a step's values classified (StepCensus) only
// where its scan saw a magnitude below the normal range.
template <GemmElem Elem, int kBounds>
void census_sparse_of(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                      CensusCounts* counts) {
  double acc[8] = {};
  StepCensus<Elem, kBounds> dirty(WideBounds(b, Elem), Elem);
  ScanStepSse2 scan(b, Elem);
  for (int64_t j0 = 0; j0 < len; j0 += kStepValues) {
    const bool below = scan.below(x, stride, j0);
    sum_step_of<Elem>(x, stride, j0, inv, acc);
    if (below) dirty.add(x, stride, j0);
  }
  if (!store_sums(acc, out)) return census_full_of<Elem>(x, stride, len, inv, b, out, counts);  // the same sums again
  // No inf and no NaN: the plain steps' values are all normal, so only the dirty steps add
  // counts, and the amax is the scan's (every value's).
  dirty.into(counts);
  counts->amax = std::max(counts->amax, scan.amax());
}

template <GemmElem Elem, int kBounds>
void census_loop_of(bool dense, const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                    CensusCounts* counts) {
  if (dense) census_dense_of<Elem, kBounds>(x, stride, len, inv, b, out, counts);
  else census_sparse_of<Elem, kBounds>(x, stride, len, inv, b, out, counts);
}

// Sparse where the call's first steps are mostly plain (as on the AVX paths), dense otherwise.
template <GemmElem Elem>
void sum_squares_census_8_of(const void* x, int64_t stride, int64_t len, float inv, CensusBounds b, double* out,
                             CensusCounts* counts) {
  if (len % kStepValues != 0) return census_full_of<Elem>(x, stride, len, inv, b, out, counts);
  ScanStepSse2 probe(b, Elem);
  int flagged = 0;
  for (int64_t j = 0; j < std::min<int64_t>(len, 8 * kStepValues); j += kStepValues)
    flagged += probe.below(x, stride, j) ? 1 : 0;
  const bool dense = flagged > 2;
  const int distinct = WideBounds(b, Elem).distinct();
  if (distinct == 1) census_loop_of<Elem, 1>(dense, x, stride, len, inv, b, out, counts);
  else if (distinct == 2) census_loop_of<Elem, 2>(dense, x, stride, len, inv, b, out, counts);
  else census_loop_of<Elem, 3>(dense, x, stride, len, inv, b, out, counts);
}

void sum_squares_census_8(const void* x, GemmElem elem, int64_t stride, int64_t len, float inv, CensusBounds b,
                          double* out, CensusCounts* counts) {
  if (elem == GemmElem::F32) sum_squares_census_8_of<GemmElem::F32>(x, stride, len, inv, b, out, counts);
  else if (elem == GemmElem::F16) sum_squares_census_8_of<GemmElem::F16>(x, stride, len, inv, b, out, counts);
  else sum_squares_census_8_of<GemmElem::BF16>(x, stride, len, inv, b, out, counts);
}
#endif

// ---- GELU ----------------------------------------------------------------------------------
// erf_f32 takes a short polynomial below |x| = 0.875 and a long one (degree 15) above, and a
// plain vector loop computes both on every lane. GELU's erf runs a block at a time instead
// (AVX2, AVX-512): the short one on every value, the long one only on the values that need
// it, gathered together. The same operations on each value: every path, either way, gives
// the same bits.
constexpr int64_t kErfBlock = 512;

#if defined(BELAY_ISA_avx512)
// The values that take the long branch (or are NaN), 16 at a time: packed to the front of
// `large` (vcompressps into a register, then a plain store: the memory form is slow on some
// CPUs), their masks kept for the way back. Returns how many.
constexpr int64_t kErfLanes = 16;
using LaneMask = __mmask16;

int64_t gather_large(const float* z, int64_t n, float* large, LaneMask* masks) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += kErfLanes) {
    const __m512 v = _mm512_loadu_ps(z + i);
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(0.875f), _CMP_NLT_UQ);
    masks[i / kErfLanes] = m;
    _mm512_storeu_ps(large + count, _mm512_maskz_compress_ps(m, v));
    count += __builtin_popcount(m);
  }
  return count;
}

// Puts the long branch's results back in their places in e, which holds the short one's.
void scatter_large(const float* large_e, const LaneMask* masks, int64_t n, float* e) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += kErfLanes) {
    const __mmask16 m = masks[i / kErfLanes];
    const __m512 packed = _mm512_loadu_ps(large_e + count);
    _mm512_storeu_ps(e + i, _mm512_mask_expand_ps(_mm512_loadu_ps(e + i), m, packed));
    count += __builtin_popcount(m);
  }
}
#elif defined(BELAY_ISA_avx2)
// AVX2 has no compress: a table gives, for each mask of 8 lanes, the permutation that packs
// the set lanes to the front (`pack`) and the one that spreads them back (`unpack`), as 8
// lane numbers of 4 bits each, for vpermps.
constexpr int64_t kErfLanes = 8;
using LaneMask = uint8_t;

struct LanePermutations {
  uint32_t pack[256], unpack[256];
};
constexpr LanePermutations make_lane_permutations() {
  LanePermutations t{};
  for (int m = 0; m < 256; ++m) {
    int k = 0;
    for (int lane = 0; lane < 8; ++lane)
      if ((m >> lane) & 1) {
        t.pack[m] |= static_cast<uint32_t>(lane) << (4 * k);  // output k takes input `lane`
        t.unpack[m] |= static_cast<uint32_t>(k) << (4 * lane);  // and lane `lane` takes it back
        ++k;
      }
  }
  return t;
}
constexpr LanePermutations kLanePermutations = make_lane_permutations();

inline __m256i lane_numbers(uint32_t nibbles) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(nibbles)), shifts),
                          _mm256_set1_epi32(7));
}

int64_t gather_large(const float* z, int64_t n, float* large, LaneMask* masks) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += kErfLanes) {
    const __m256 v = _mm256_loadu_ps(z + i);
    const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), _mm256_set1_ps(0.875f), _CMP_NLT_UQ));
    masks[i / kErfLanes] = static_cast<LaneMask>(m);
    _mm256_storeu_ps(large + count, _mm256_permutevar8x32_ps(v, lane_numbers(kLanePermutations.pack[m])));
    count += __builtin_popcount(static_cast<unsigned>(m));
  }
  return count;
}

void scatter_large(const float* large_e, const LaneMask* masks, int64_t n, float* e) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += kErfLanes) {
    const int m = masks[i / kErfLanes];
    const __m256 spread = _mm256_permutevar8x32_ps(_mm256_loadu_ps(large_e + count), lane_numbers(kLanePermutations.unpack[m]));
    const __m256i taken = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), lane_bits), lane_bits);
    _mm256_storeu_ps(e + i, _mm256_blendv_ps(_mm256_loadu_ps(e + i), spread, _mm256_castsi256_ps(taken)));
    count += __builtin_popcount(static_cast<unsigned>(m));
  }
}
#endif

// A function of z with two branches (erf's, or GELU's derivative's: erf_exp.h), the short one
// exactly where erf_takes_small(z): Small and Large are its branches, and f(z) =
// erf_takes_small(z) ? Small(z) : Large(z).
struct ErfBranches {
  static float small(float z) { return cpu_math::erf_small(z); }
  static float large(float z) { return cpu_math::erf_large(z); }
};
struct GeluGradBranches {
  static float small(float z) { return cpu_math::gelu_grad_small(z); }
  static float large(float z) { return cpu_math::gelu_grad_large(z); }
};
// f(z) with both branches computed and one selected (no branch: a loop of it vectorizes).
template <class F>
float both_branches(float z) {
  return cpu_math::select_f32(cpu_math::erf_takes_small(z), F::small(z), F::large(z));
}

#if defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx2)
// f(z) for n <= kErfBlock values into e: the whole vectors as above, the tail plainly.
template <class F>
void branch_block(const float* z, float* e, int64_t n) {
  alignas(64) float large[kErfBlock + kErfLanes], large_e[kErfBlock + kErfLanes];
  LaneMask masks[kErfBlock / kErfLanes];
  const int64_t whole = n - n % kErfLanes;
  const int64_t count = gather_large(z, whole, large, masks);
  // The long branch on whole vectors: the packed values padded with zeros (computed, never
  // spread back), no scalar tail of up to 15 long polynomials a block.
  const int64_t padded = (count + kErfLanes - 1) / kErfLanes * kErfLanes;
  for (int64_t i = count; i < padded; ++i) large[i] = 0.0f;
  for (int64_t i = 0; i < whole; ++i) e[i] = F::small(z[i]);
  for (int64_t i = 0; i < padded; ++i) large_e[i] = F::large(large[i]);
  scatter_large(large_e, masks, whole, e);
  for (int64_t i = whole; i < n; ++i) e[i] = both_branches<F>(z[i]);
}
#else
// The baseline: both branches on every lane (SSE2 has no lane permutation to gather with).
template <class F>
void branch_block(const float* z, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = both_branches<F>(z[i]);
}
#endif

// z = x / sqrt 2 for len <= kErfBlock values: GELU's and its gradient's argument of erf.
// Returns whether every one takes erf's short branch (none NaN): three operations a vector more.
bool erf_args(const float* x, float* z, int64_t len) {
  uint32_t all_short = 1;
  for (int64_t i = 0; i < len; ++i) {
    z[i] = cpu_math::gelu_erf_arg(x[i]);
    all_short &= cpu_math::erf_takes_small(z[i]) ? 1u : 0u;
  }
  return all_short != 0;
}

// GELU and its gradient a block at a time: the arguments z = x / sqrt 2 into a buffer, then,
// where every one of the block takes the short branch (as many of an MLP's blocks do at
// initialisation, its pre-activations small), F's short branch and the formula in one loop;
// otherwise F(z) into a buffer (branch_block: the long branch only where needed), then the
// formula. Each value's operations are erf_exp.h's either way: the same bits. The one loop took
// GELU and its gradient from 6.0% to 4.8% of the default GPT's fp32 step's perf samples (Zen 4,
// 1 thread); on N(0, 1) or uniform(-5, 5) values, whose blocks all hold long ones, the time
// stayed within the noise. formula(i, f) writes output i from x[i] (and the caller's other
// inputs) and f = F(x[i] / sqrt 2); it runs after every F of its block, so an output may be an
// input.
template <class F, class Formula>
void by_branch_blocks(const float* x, int64_t n, Formula&& formula) {
  alignas(64) float z[kErfBlock], e[kErfBlock];
  for (int64_t at = 0; at < n; at += kErfBlock) {
    const int64_t len = std::min(kErfBlock, n - at);
    if (erf_args(x + at, z, len)) {
      for (int64_t i = 0; i < len; ++i) formula(at + i, F::small(z[i]));
      continue;
    }
    branch_block<F>(z, e, len);
    for (int64_t i = 0; i < len; ++i) formula(at + i, e[i]);
  }
}

// y may be x.
void gelu(const float* x, float* y, int64_t n) {
  by_branch_blocks<ErfBranches>(x, n, [&](int64_t i, float e) { y[i] = cpu_math::gelu_from_erf(x[i], e); });
}

// dx = dy * gelu'(x); a NaN x passes through as it is. (When x and dy are both NaN, which one a
// product returns depends on which operand sits in which register, and that differs between the
// SSE and AVX code: the select keeps every path's bits the baseline's.) dx may be dy.
void gelu_grad(const float* x, const float* dy, float* dx, int64_t n) {
  by_branch_blocks<GeluGradBranches>(x, n, [&](int64_t i, float g) {
    dx[i] = cpu_math::select_f32(x[i] != x[i], x[i], dy[i] * g);
  });
}

// The other activations: plain loops the vectorizer widens (erf_exp.h has no call and no
// branch).
void gelu_tanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = cpu_math::gelu_tanh(x[i]);
}

// As gelu_grad: a NaN x passes through as it is, whatever dy is.
void gelu_tanh_grad(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = cpu_math::select_f32(x[i] != x[i], x[i], dy[i] * cpu_math::gelu_tanh_grad(x[i]));
}

void relu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_grad(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

// adamw_element on every element, left to the compiler's vectorizer (the baseline's SSE2).
void adamw_scalar(const AdamWBlock& b, int64_t from) {
  const float* __restrict g = b.g;
  float* __restrict p = b.p;
  float* __restrict m = b.m;
  float* __restrict v = b.v;
  for (int64_t j = from; j < b.len; ++j)
    adamw_element(effective_grad(g[j], b.inv_scale, b.clip_coef), p[j], m[j], v[j], b.lr, b.beta1, b.beta2, b.eps,
                  b.weight_decay, b.bias_correction1, b.bias_correction2);
}

// sgd_element on every element, left to the compiler's vectorizer at this path's width (the
// same operations in the same order on every path: -ffp-contract=off).
void sgd(const SgdBlock& b) {
  const float* __restrict g = b.g;
  float* __restrict p = b.p;
  float* __restrict buf = b.buf;
  if (buf) {
    for (int64_t j = 0; j < b.len; ++j)
      sgd_element(effective_grad(g[j], b.inv_scale, b.clip_coef), p[j], buf[j], b.lr, b.momentum, b.weight_decay,
                  true);
    return;
  }
  for (int64_t j = 0; j < b.len; ++j) {
    float unused = 0.0f;
    sgd_element(effective_grad(g[j], b.inv_scale, b.clip_coef), p[j], unused, b.lr, b.momentum, b.weight_decay,
                false);
  }
}

#if defined(BELAY_ISA_avx2) || defined(BELAY_ISA_avx512)
// F16C: eight at a time, nearest even given in the instruction (MXCSR's mode does not
// matter); the tail through half_bits.h.
void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  const __m128i exp_quiet = _mm_set1_epi16(0x7e00), exp_only = _mm_set1_epi16(0x7c00);
  const __m128i mant = _mm_set1_epi16(0x03ff), zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    // F16C quiets a signalling NaN; half_bits.h keeps its payload as it is. Rare: redo those.
    const __m128i snan = _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(h, mant), zero),
                                          _mm_cmpeq_epi16(_mm_and_si128(h, exp_quiet), exp_only));
    if (_mm_movemask_epi8(snan))
      for (int64_t k = i; k < i + 8; ++k) dst[k] = f16_bits_to_f32(src[k]);
  }
  for (; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
}

// adamw_element eight at a time, the same operations in the same order, and the FP16 working
// copy written in the same pass, with non-temporal stores when asked (a line written and not
// read: it skips the read a plain store would make first; same bits).
bool adamw(const AdamWBlock& b) {
  const float* __restrict g = b.g;
  float* __restrict p = b.p;
  float* __restrict m = b.m;
  float* __restrict v = b.v;
  uint16_t* __restrict w16 = b.w16;
  const __m256 vinv = _mm256_set1_ps(b.inv_scale), vcoef = _mm256_set1_ps(b.clip_coef), vlr = _mm256_set1_ps(b.lr);
  const __m256 vdecay = _mm256_set1_ps(1.0f - b.lr * b.weight_decay);
  const __m256 vb1 = _mm256_set1_ps(b.beta1), v1mb1 = _mm256_set1_ps(1.0f - b.beta1);
  const __m256 vb2 = _mm256_set1_ps(b.beta2), v1mb2 = _mm256_set1_ps(1.0f - b.beta2);
  const __m256 vbc1 = _mm256_set1_ps(b.bias_correction1), vbc2 = _mm256_set1_ps(b.bias_correction2);
  const __m256 veps = _mm256_set1_ps(b.eps);
  const bool stream = b.stream && reinterpret_cast<uintptr_t>(w16) % 16 == 0;
  int64_t j = 0;
  for (; j + 8 <= b.len; j += 8) {
    const __m256 gg = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + j), vinv), vcoef);  // effective_grad
    const __m256 pp = _mm256_mul_ps(_mm256_loadu_ps(p + j), vdecay);
    const __m256 mm = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + j)), _mm256_mul_ps(v1mb1, gg));
    const __m256 vv =
        _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + j)), _mm256_mul_ps(_mm256_mul_ps(v1mb2, gg), gg));
    const __m256 m_hat = _mm256_div_ps(mm, vbc1), v_hat = _mm256_div_ps(vv, vbc2);
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(vlr, m_hat), _mm256_add_ps(_mm256_sqrt_ps(v_hat), veps));
    const __m256 pn = _mm256_sub_ps(pp, step);
    // p, m and v were just read: their lines are in the cache, and a plain store only marks
    // them dirty (a non-temporal store would evict them first: measured 1.8x slower at 64M
    // parameters on Zen 3). Only the working copy, written and never read here, streams.
    _mm256_storeu_ps(p + j, pn);
    _mm256_storeu_ps(m + j, mm);
    _mm256_storeu_ps(v + j, vv);
    if (w16) {
      const __m128i h = _mm256_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT);
      if (stream)
        _mm_stream_si128(reinterpret_cast<__m128i*>(w16 + j), h);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w16 + j), h);
    }
  }
  if (stream) _mm_sfence();  // non-temporal stores visible before anyone reads them
  adamw_scalar(b, j);
  if (w16)
    for (; j < b.len; ++j) w16[j] = f32_to_f16_bits(p[j]);
  return w16 != nullptr;
}
#else
// Baseline x86-64 has no F16C: half_bits.h's integer conversions, exact by construction.
void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16_bits(src[i]);
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(src[i]);
}

bool adamw(const AdamWBlock& b) {
  adamw_scalar(b, 0);
  return false;
}
#endif

// ---- LayerNorm and softmax rows -------------------------------------------------------------
// A row's sums over kLanes lanes (in FP32 for LayerNorm, in double for softmax): element j
// goes to lane j % kLanes in index order, then the lanes are added pairwise (8 + 8, 4 + 4,
// 2 + 2, 1 + 1). The order is fixed by the code, not by the vector width, so every path
// gives the baseline's bits; the compiler keeps the 16 lanes in registers (one zmm or two
// ymm of FP32, two zmm or four ymm of double; a loop on baseline). The row maximum runs over
// the same lanes (a maximum does not depend on the order, but a NaN's place would).
constexpr int64_t kLanes = 16;

template <class Acc>
inline Acc reduce_lanes(Acc (&acc)[kLanes]) {
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

template <class Acc, class F>
inline Acc lane_sum(int64_t n, F&& f) {
  Acc acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) acc[k] += f(j + k);
  for (int64_t k = 0; j + k < n; ++k) acc[k] += f(j + k);
  return reduce_lanes(acc);
}

// Two lane_sums of the same n in one loop, each over its own lanes in lane_sum's order (the
// same bits as two calls): two independent chains, so each waits on the other's adds half as
// much, and the row is read once. f(j) returns both terms of element j as a pair.
template <class Acc, class F>
inline std::pair<Acc, Acc> lane_sum_pair(int64_t n, F&& f) {
  Acc a[kLanes] = {}, b[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) {
      const auto [u, v] = f(j + k);
      a[k] += u;
      b[k] += v;
    }
  for (int64_t k = 0; j + k < n; ++k) {
    const auto [u, v] = f(j + k);
    a[k] += u;
    b[k] += v;
  }
  return {reduce_lanes(a), reduce_lanes(b)};
}

// The maximum of x[0, n) over the same lanes: a NaN element is skipped (m < NaN is false,
// as in std::max(m, x)); the row's exp then gives NaN anyway. The whole blocks run as
// MAXPS(x, m), which is exactly m < x ? x : m per lane (it returns its second operand when
// either is NaN), in registers of this path's width (g++ leaves the ?: loop scalar).
inline float lane_max(const float* x, int64_t n) {
  alignas(64) float acc[kLanes];
  int64_t j = 0;
#if defined(BELAY_ISA_avx512)
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (; j + kLanes <= n; j += kLanes) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
  _mm512_store_ps(acc, m);
#elif defined(BELAY_ISA_avx2)
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  for (; j + kLanes <= n; j += kLanes) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + j), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), m1);
  }
  _mm256_store_ps(acc, m0);
  _mm256_store_ps(acc + 8, m1);
#else
  __m128 m[4];
  for (__m128& v : m) v = _mm_set1_ps(-INFINITY);
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < 4; ++k) m[k] = _mm_max_ps(_mm_loadu_ps(x + j + 4 * k), m[k]);
  for (int k = 0; k < 4; ++k) _mm_store_ps(acc + 4 * k, m[k]);
#endif
  for (int64_t k = 0; j + k < n; ++k) acc[k] = acc[k] < x[j + k] ? x[j + k] : acc[k];
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t k = 0; k < w; ++k) acc[k] = acc[k] < acc[k + w] ? acc[k + w] : acc[k];
  return acc[0];
}

// Reads x twice (mean, then the variance of x - mean: two passes, no cancellation), writes y.
// 2 loads, 1 store and ~7 flops per element.
void layer_norm_row(const float* x, const float* w, const float* b, int64_t n, float eps, float* y, float* mean_out,
                    float* rstd_out) {
  const float nf = static_cast<float>(n);
  const float mean = lane_sum<float>(n, [&](int64_t j) { return x[j]; }) / nf;
  const float var = lane_sum<float>(n, [&](int64_t j) {
                      const float d = x[j] - mean;
                      return d * d;
                    }) / nf;
  const float rstd = 1.0f / sqrtf(var + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mean) * rstd * w[j] + b[j];
  *mean_out = mean;
  *rstd_out = rstd;
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w; dw[j] += dy xhat and db[j] += dy in
// double (the caller sums a fixed chunk of rows into them, then the chunks in order).
void layer_norm_row_backward(const float* x, const float* dy, const float* w, int64_t n, float mean, float rstd,
                             float* dx, double* dw, double* db) {
  const float nf = static_cast<float>(n);
  const auto [sg, sgx] = lane_sum_pair<float>(n, [&](int64_t j) {
    const float g = dy[j] * w[j];
    return std::pair<float, float>{g, g * ((x[j] - mean) * rstd)};
  });
  const float mg = sg / nf, mgx = sgx / nf;
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * ((dy[j] * w[j] - mg) - xhat * mgx);
    dw[j] += static_cast<double>(dy[j] * xhat);
    db[j] += static_cast<double>(dy[j]);
  }
}

// Softmax: reads x twice (the maximum, then e^(x - max) into y), y twice more in L1 (the sum,
// the scaling); memory traffic 1 read and 1 write per element, ~25 flops (exp_f32).
// log-softmax: y = (x - max) - log z, the difference in double, rounded once. e^(x - max) is
// staged kStage values at a time on the stack (y may be x, so it cannot hold them), the
// stage's values added to the same lanes as lane_sum would (kStage is a multiple of kLanes).
constexpr int64_t kStage = 256;

void softmax_row(const float* x, float* y, int64_t n, int64_t live, bool log) {
  const float mx = lane_max(x, live);
  if (log) {
    double acc[kLanes] = {};
    float e[kStage];
    for (int64_t j0 = 0; j0 < live; j0 += kStage) {
      const int64_t len = std::min(kStage, live - j0);
      for (int64_t i = 0; i < len; ++i) e[i] = cpu_math::exp_f32(x[j0 + i] - mx);
      int64_t i = 0;
      for (; i + kLanes <= len; i += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) acc[k] += static_cast<double>(e[i + k]);
      for (int64_t k = 0; i + k < len; ++k) acc[k] += static_cast<double>(e[i + k]);
    }
    const double log_z = std::log(reduce_lanes(acc));
    for (int64_t j = 0; j < live; ++j) y[j] = static_cast<float>(static_cast<double>(x[j] - mx) - log_z);
  } else {
    // y = e * (1 / z) in FP32: two roundings (within 1.5 ulps), a multiply where a division
    // in double would cost two conversions and a divide per element.
    for (int64_t j = 0; j < live; ++j) y[j] = cpu_math::exp_f32(x[j] - mx);
    const double z = lane_sum<double>(live, [&](int64_t j) { return static_cast<double>(y[j]); });
    const float inv_z = static_cast<float>(1.0 / z);
    for (int64_t j = 0; j < live; ++j) y[j] = y[j] * inv_z;
  }
  for (int64_t j = live; j < n; ++j) y[j] = log ? -INFINITY : 0.0f;
}

// Reads y and dy twice (the second time from L1), writes dx once; ~4 flops per element (log:
// an exp_f32 more). The sum of dy y in double: each product exact, the sum in lanes.
void softmax_row_backward(const float* y, const float* dy, float* dx, int64_t n, int64_t live, bool log) {
  const double s = log ? lane_sum<double>(live, [&](int64_t j) { return static_cast<double>(dy[j]); })
                       : lane_sum<double>(live, [&](int64_t j) {
                           return static_cast<double>(dy[j]) * static_cast<double>(y[j]);
                         });
  const float sf = static_cast<float>(s);
  if (log)
    for (int64_t j = 0; j < live; ++j) dx[j] = dy[j] - cpu_math::exp_f32(y[j]) * sf;
  else
    for (int64_t j = 0; j < live; ++j) dx[j] = y[j] * (dy[j] - sf);
  for (int64_t j = live; j < n; ++j) dx[j] = 0.0f;
}

// One lane per column: the vectorizer widens it (8 doubles a zmm on avx512, 2 on baseline's
// SSE2, where the backend's generic loop ran).
void add_row_f64(const float* v, int64_t n, double* acc) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(v[j]);
}

}  // namespace

extern const ElementBlocks element_blocks = {f32_to_f16, f16_to_f32, f32_to_bf16, bf16_to_f32, unscale, adamw,
                                             sgd,        gelu,       gelu_grad,   gelu_tanh,   gelu_tanh_grad,
                                             relu,       relu_grad,
                                             sum_squares_8, sum_squares_8_at, sum_squares_census_8_at, kCensusRound,
                                             sum_squares_census_8, layer_norm_row,
                                             layer_norm_row_backward,
                                             softmax_row, softmax_row_backward, add_row_f64};

}  // namespace belay::BELAY_ISA_NS
