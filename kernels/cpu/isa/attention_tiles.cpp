// The fused attention's tile products for one vector ISA (attention_tiles.h), built once per
// path by isa.cmake. Written with GCC's vector extensions: Vec is the path's widest float
// vector (4 lanes on baseline's SSE2, 8 on avx2, 16 on avx512), the loops are the same on
// every path, and only vfma differs: one fused instruction where the CPU has FMA, a multiply
// and an add on baseline (-ffp-contract=off keeps them two roundings there).
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/attention_tiles.cpp is built once per ISA by isa.cmake"
#endif
#include "kernels/cpu/isa/attention_tiles.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/isa/erf_exp.h"
#include "kernels/cpu/isa/float_vec.h"

namespace belay::BELAY_ISA_NS {
namespace {

constexpr int kLanes = kVecWidth;  // floats in a register (float_vec.h)

// a * b + c, rounded once where the path has FMA.
inline Vec vfma(Vec a, Vec b, Vec c) {
#if defined(BELAY_ISA_avx512)
  return reinterpret_cast<Vec>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                               reinterpret_cast<__m512>(c)));
#elif defined(BELAY_ISA_avx2)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

// Rows blocked by kRowBlock and columns by kColVecs vectors: kRowBlock x kColVecs accumulators
// (8 on the 16-register paths, 16 on avx512's 32), enough independent FMAs to hide their
// latency, and each vector loaded once for all the rows of the block. The blocking changes no
// element's order of summation, so it changes no bit. avx2 takes 4 rows x 2 vectors: on Zen 4
// (forced avx2, GPT-2 small's attention, B 4 H 12 T 1024 d 64, one thread, the fastest of 11)
// the forward took 102 ms against 117 ms with 2 rows x 4 vectors, forward + backward 296-300
// ms against 375-382 (4 x 2 for the score tiles alone: 110 / 335-337; for the weighted sums
// alone: 109 / 335-343; 6 x 2 for the score tiles, 12 accumulators: slower, 129 / 382). avx512's
// 4 x 4 measured best there against 8 x 2 and 6 x 4 (83 / 260-264 ms against 99-100 / 312-319).
#if defined(BELAY_ISA_avx2)
constexpr int kRowBlock = 4;
constexpr int kColVecs = 2;
#else
constexpr int kRowBlock = kLanes == 16 ? 4 : 2;
constexpr int kColVecs = 4;
#endif
constexpr int64_t kColChunk = kColVecs * kLanes;
static_assert(kAttnKeys % kColChunk == 0 && kAttnPad % kLanes == 0, "whole chunks");

// Scores of R rows against V vectors of a tile's keys from column j (s = a bt there).
template <int R, int V>
void dot_block(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t d, int64_t j, float* s) {
  Vec acc[R][V] = {};
  for (int64_t c = 0; c < d; ++c) {
    const float* b = bt + c * ldb + j;
    Vec bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = vload(b + v * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const Vec x = vsplat(a[r * lda + c]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = vfma(x, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vstore(s + r * kAttnKeys + j + v * kLanes, acc[r][v]);
}

// R rows' scores against the tile's first `cols` keys, rounded up to whole vectors: whole
// chunks of kColVecs vectors, then the 1 to kColVecs - 1 left in one pass.
template <int R>
void dot_rows(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t d, int64_t cols, float* s) {
  const int64_t vecs = (cols + kLanes - 1) / kLanes;
  int64_t j = 0;
  for (; j + kColChunk <= vecs * kLanes; j += kColChunk) dot_block<R, kColVecs>(a, lda, bt, ldb, d, j, s);
  switch (vecs - j / kLanes) {
    case 3: dot_block<R, 3>(a, lda, bt, ldb, d, j, s); break;
    case 2: dot_block<R, 2>(a, lda, bt, ldb, d, j, s); break;
    case 1: dot_block<R, 1>(a, lda, bt, ldb, d, j, s); break;
    default: break;
  }
}

void dot_tile(const float* a, int64_t lda, int64_t rows, const float* bt, int64_t ldb, int64_t d, int64_t cols,
              float* s) {
  int64_t r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock) dot_rows<kRowBlock>(a + r * lda, lda, bt, ldb, d, cols, s + r * kAttnKeys);
  for (; r < rows; ++r) dot_rows<1>(a + r * lda, lda, bt, ldb, d, cols, s + r * kAttnKeys);
}

// out[i] += sum over t < terms of w[i wi + t wt] x[t] for R output rows i, over V vectors of
// columns: R x V accumulators, each x vector loaded once for the R rows.
template <int R, int V>
void weigh_vectors(const float* w, int64_t wi, int64_t wt, int64_t terms, const float* x, int64_t ldx, float* out,
                   int64_t ldo) {
  Vec acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = vload(out + r * ldo + v * kLanes);
  for (int64_t t = 0; t < terms; ++t) {
    const float* xr = x + t * ldx;
    Vec xv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) xv[v] = vload(xr + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec p = vsplat(w[r * wi + t * wt]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = vfma(p, xv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vstore(out + r * ldo + v * kLanes, acc[r][v]);
}

// The R output rows of dp floats (a whole number of vectors), the terms in order: weigh_rows
// (w indexed [i, t]) and weigh_cols ([t, i]) both. Whole chunks of kColVecs vectors, then the
// 1 to kColVecs - 1 vectors left in one pass (a head of 32 on avx512 is two vectors: 8
// accumulators for 4 rows, where a vector at a time kept 4 and read w twice). Each element's
// sum is the same in either shape: the blocking changes no bit.
template <int R>
void weigh_block(const float* w, int64_t wi, int64_t wt, int64_t terms, const float* x, int64_t ldx, int64_t dp,
                 float* out, int64_t ldo) {
  int64_t c = 0;
  for (; c + kColChunk <= dp; c += kColChunk) weigh_vectors<R, kColVecs>(w, wi, wt, terms, x + c, ldx, out + c, ldo);
  switch ((dp - c) / kLanes) {
    case 3: weigh_vectors<R, 3>(w, wi, wt, terms, x + c, ldx, out + c, ldo); break;
    case 2: weigh_vectors<R, 2>(w, wi, wt, terms, x + c, ldx, out + c, ldo); break;
    case 1: weigh_vectors<R, 1>(w, wi, wt, terms, x + c, ldx, out + c, ldo); break;
    default: break;
  }
}

void weigh(const float* w, int64_t wi, int64_t wt, int64_t outs, int64_t terms, const float* x, int64_t ldx,
           int64_t dp, float* out, int64_t ldo) {
  int64_t i = 0;
  // Rows of two vectors or fewer (a head of 32 on avx512) go 2 x kRowBlock at a time: 16
  // accumulators on avx512 where kRowBlock rows kept 8, exactly the FMA's latency times its two
  // ports, with no slack for a load that comes late. Not on the 16-register paths (16
  // accumulators there would spill).
  if (kLanes == 16 && dp <= 2 * kLanes)
    for (; i + 2 * kRowBlock <= outs; i += 2 * kRowBlock)
      weigh_block<2 * kRowBlock>(w + i * wi, wi, wt, terms, x, ldx, dp, out + i * ldo, ldo);
  for (; i + kRowBlock <= outs; i += kRowBlock)
    weigh_block<kRowBlock>(w + i * wi, wi, wt, terms, x, ldx, dp, out + i * ldo, ldo);
  for (; i < outs; ++i) weigh_block<1>(w + i * wi, wi, wt, terms, x, ldx, dp, out + i * ldo, ldo);
}

void weigh_rows(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                int64_t ldo) {
  weigh(w, kAttnKeys, 1, rows, keys, x, ldx, dp, out, ldo);
}

void weigh_cols(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                int64_t ldo) {
  weigh(w, 1, kAttnKeys, keys, rows, x, ldx, dp, out, ldo);
}

// Arguments below kExpFloor give 0: e^x is then under FP32's smallest normal, a probability
// that cannot move a sum of at least 1 (the row's maximum term), and computing it would make
// subnormal intermediates (slow on x86: a microcode assist per lane). The masked scores (-inf)
// are among them. The argument is clamped first so that no lane computes one; the selects are
// bit masks (erf_exp.h) so the loop stays vectorized.
// The exp's multiply-adds fused where the path fuses the products' (vfma above): on avx2 and
// avx512 the same single roundings (the two agree bit for bit), on baseline a multiply and an
// add, exp_f32's own bits.
struct PathMulAdd {
#if defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx2)
  static float f(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
  static float f(float a, float b, float c) { return a * b + c; }
#endif
};
constexpr float kExpFloor = -87.0f;  // e^-87 = 1.6e-38 > FLT_MIN
inline float exp_or_zero(float x) {
  const bool tiny = x < kExpFloor;
  return cpu_math::select_f32(tiny, 0.0f, cpu_math::exp_f32_with<PathMulAdd>(cpu_math::select_f32(tiny, kExpFloor, x)));
}

// The first `vis` of a tile's scores scaled, the rest -inf: what the softmax of the row sees.
inline void scale_and_mask(float* s, int64_t vis, float scale) {
  for (int64_t j = 0; j < kAttnKeys; ++j) s[j] = cpu_math::select_f32(j < vis, s[j] * scale, -INFINITY);
}

// The sum of a tile's kAttnKeys values in kAttnPad partial sums, then a fixed tree: the same
// additions in the same order on every path (and a vectorized loop, not a chain of 64 adds).
inline float tile_sum(const float* p) {
  float part[kAttnPad] = {};
  for (int64_t j0 = 0; j0 < kAttnKeys; j0 += kAttnPad)
    for (int64_t i = 0; i < kAttnPad; ++i) part[i] += p[j0 + i];
  for (int64_t w = kAttnPad / 2; w > 0; w /= 2)
    for (int64_t i = 0; i < w; ++i) part[i] += part[i + w];
  return part[0];
}

inline float tile_max(const float* s, float start) {
  float part[kAttnPad];
  for (int64_t i = 0; i < kAttnPad; ++i) part[i] = start;
  for (int64_t j0 = 0; j0 < kAttnKeys; j0 += kAttnPad)
    for (int64_t i = 0; i < kAttnPad; ++i) part[i] = part[i] > s[j0 + i] ? part[i] : s[j0 + i];
  float m = part[0];
  for (int64_t i = 1; i < kAttnPad; ++i) m = m > part[i] ? m : part[i];
  return m;
}

void online_softmax(float* s, int64_t vis, float scale, float* m, float* l, float* o, int64_t dp) {
  scale_and_mask(s, vis, scale);
  const float mx = tile_max(s, *m);
  const float correction = exp_or_zero(*m - mx);  // 0 on the row's first tile (m = -inf)
  for (int64_t j = 0; j < kAttnKeys; ++j) s[j] = exp_or_zero(s[j] - mx);
  *l = *l * correction + tile_sum(s);
  for (int64_t c = 0; c < dp; ++c) o[c] *= correction;
  *m = mx;
}

// tile_max and tile_sum with the same results on the AVX paths in a few vector steps (the
// scalar tails are chains of 15 dependent operations per row): a maximum is the same in any
// order, and the sums fold halves (8, 4, 2, 1 apart), tile_sum's own tree: avx512's
// _mm512_reduce_add_ps, avx2's 16 partial sums as two vectors of 8 (Zen 4, forced avx2, GPT-2
// small's attention: the forward 93-96 ms against 101 with the scalar tails).
inline float fast_tile_max(const float* s, float start) {
#if defined(BELAY_ISA_avx512)
  const __m512 a = _mm512_max_ps(_mm512_loadu_ps(s), _mm512_loadu_ps(s + 16));
  const __m512 b = _mm512_max_ps(_mm512_loadu_ps(s + 32), _mm512_loadu_ps(s + 48));
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(a, b));
  return start > m ? start : m;
#elif defined(BELAY_ISA_avx2)
  __m256 v = _mm256_loadu_ps(s);
  for (int64_t j = 8; j < kAttnKeys; j += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + j));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float m = _mm_cvtss_f32(h);
  return start > m ? start : m;
#else
  return tile_max(s, start);
#endif
}
inline float fast_tile_sum(const float* p) {
  static_assert(kAttnKeys == 4 * kAttnPad && kAttnPad == 16, "four vectors of 16 partial sums");
#if defined(BELAY_ISA_avx512)
  __m512 part = _mm512_add_ps(_mm512_setzero_ps(), _mm512_loadu_ps(p));
  for (int64_t j0 = kAttnPad; j0 < kAttnKeys; j0 += kAttnPad) part = _mm512_add_ps(part, _mm512_loadu_ps(p + j0));
  return _mm512_reduce_add_ps(part);
#elif defined(BELAY_ISA_avx2)
  __m256 lo = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(p));  // part[0..7]
  __m256 hi = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(p + 8));  // part[8..15]
  for (int64_t j0 = kAttnPad; j0 < kAttnKeys; j0 += kAttnPad) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(p + j0));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(p + j0 + 8));
  }
  const __m256 w8 = _mm256_add_ps(lo, hi);  // part[i] += part[i + 8]
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(w8), _mm256_extractf128_ps(w8, 1));  // + part[i + 4]
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));  // + part[i + 2]
  return _mm_cvtss_f32(_mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1)));  // + part[1]
#else
  return tile_sum(p);
#endif
}

// s[j] = exp(s[j] - shift) for the first `vis` keys rounded up to whole kAttnPad groups, 0 for
// the rest: the masked scores (-inf) give exp_or_zero's 0 either way, so only the exps are
// saved (a causal tile's rows see 1 to 64 keys: 5/8 of the exps on average).
inline void exp_seen(float* s, int64_t vis, float shift) {
  const int64_t seen = (vis + kAttnPad - 1) / kAttnPad * kAttnPad;
  for (int64_t j = 0; j < seen; ++j) s[j] = exp_or_zero(s[j] - shift);
  for (int64_t j = seen; j < kAttnKeys; ++j) s[j] = 0.0f;
}

void online_softmax_rows(float* s, const int64_t* vis, int64_t rows, float scale, float* m, float* l, float* o,
                         int64_t ldo, int64_t dp) {
  float mx[kAttnMaxRows], correction[kAttnMaxRows];
  for (int64_t r = 0; r < rows; ++r) {
    mx[r] = m[r];
    if (vis[r] == 0) continue;
    scale_and_mask(s + r * kAttnKeys, vis[r], scale);
    mx[r] = fast_tile_max(s + r * kAttnKeys, m[r]);
  }
  // m - mx is NaN only for a row that has seen no key yet and none now (-inf - -inf): a
  // correction of 1 there (nothing to rescale); exp_or_zero gives 0 for a first tile's -inf.
  for (int64_t r = 0; r < rows; ++r)
    correction[r] = cpu_math::select_f32(mx[r] == m[r], 1.0f, exp_or_zero(m[r] - mx[r]));
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kAttnKeys;
    if (vis[r] == 0) {
      for (int64_t j = 0; j < kAttnKeys; ++j) sr[j] = 0.0f;
      continue;
    }
    exp_seen(sr, vis[r], mx[r]);
    l[r] = l[r] * correction[r] + fast_tile_sum(sr);
    if (correction[r] != 1.0f)
      for (int64_t c = 0; c < dp; ++c) o[r * ldo + c] *= correction[r];
    m[r] = mx[r];
  }
}

void probabilities(float* s, float* dp, int64_t vis, float scale, float lse, float dsum) {
  scale_and_mask(s, vis, scale);
  exp_seen(s, vis, lse);
  for (int64_t j = 0; j < kAttnKeys; ++j) dp[j] = s[j] * (dp[j] - dsum);
}

}  // namespace

extern const AttentionTiles attention_tiles = {dot_tile,       weigh_rows,          weigh_cols,
                                               online_softmax, online_softmax_rows, probabilities};

}  // namespace belay::BELAY_ISA_NS
