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

#include <cstring>

#include "kernels/cpu/isa/erf_exp.h"

namespace belay::BELAY_ISA_NS {
namespace {

#if defined(BELAY_ISA_avx512)
constexpr int kLanes = 16;
#elif defined(BELAY_ISA_avx2)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float Vec __attribute__((vector_size(kLanes * 4), aligned(4)));
constexpr int kTileVecs = static_cast<int>(kAttnKeys) / kLanes;  // vectors across one tile's keys
static_assert(kAttnKeys % kLanes == 0 && kAttnPad % kLanes == 0, "tiles are whole vectors");

inline Vec vload(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);  // unaligned: one vector load
  return v;
}
inline void vstore(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
inline Vec vsplat(float x) { return Vec{} + x; }

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

// One row of scores: the tile's kAttnKeys accumulators live in registers (8 ymm on avx2),
// each key's dot product summed over c in order, one lane per key.
void dot_tile(const float* a, int64_t lda, int64_t rows, const float* bt, int64_t ldb, int64_t d, float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * lda;
    Vec acc[kTileVecs] = {};
    for (int64_t c = 0; c < d; ++c) {
      const Vec x = vsplat(ar[c]);
      const float* b = bt + c * ldb;
      for (int v = 0; v < kTileVecs; ++v) acc[v] = vfma(x, vload(b + v * kLanes), acc[v]);
    }
    for (int v = 0; v < kTileVecs; ++v) vstore(s + r * kAttnKeys + v * kLanes, acc[v]);
  }
}

// out rows += w x: four vectors of an output row held in registers while the keys stream by
// (the weights broadcast, x's rows read once per four vectors).
void weigh_rows(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = w + r * kAttnKeys;
    float* o = out + r * ldo;
    int64_t c = 0;
    for (; c + 4 * kLanes <= dp; c += 4 * kLanes) {
      Vec acc[4] = {vload(o + c), vload(o + c + kLanes), vload(o + c + 2 * kLanes), vload(o + c + 3 * kLanes)};
      for (int64_t j = 0; j < keys; ++j) {
        const Vec p = vsplat(wr[j]);
        const float* xr = x + j * ldx + c;
        for (int v = 0; v < 4; ++v) acc[v] = vfma(p, vload(xr + v * kLanes), acc[v]);
      }
      for (int v = 0; v < 4; ++v) vstore(o + c + v * kLanes, acc[v]);
    }
    for (; c < dp; c += kLanes) {
      Vec acc = vload(o + c);
      for (int64_t j = 0; j < keys; ++j) acc = vfma(vsplat(wr[j]), vload(x + j * ldx + c), acc);
      vstore(o + c, acc);
    }
  }
}

// out's key rows += w^T x: the same register blocking as weigh_rows, the sum over the rows r.
void weigh_cols(const float* w, int64_t rows, int64_t keys, const float* x, int64_t ldx, int64_t dp, float* out,
                int64_t ldo) {
  for (int64_t j = 0; j < keys; ++j) {
    float* o = out + j * ldo;
    int64_t c = 0;
    for (; c + 4 * kLanes <= dp; c += 4 * kLanes) {
      Vec acc[4] = {vload(o + c), vload(o + c + kLanes), vload(o + c + 2 * kLanes), vload(o + c + 3 * kLanes)};
      for (int64_t r = 0; r < rows; ++r) {
        const Vec p = vsplat(w[r * kAttnKeys + j]);
        const float* xr = x + r * ldx + c;
        for (int v = 0; v < 4; ++v) acc[v] = vfma(p, vload(xr + v * kLanes), acc[v]);
      }
      for (int v = 0; v < 4; ++v) vstore(o + c + v * kLanes, acc[v]);
    }
    for (; c < dp; c += kLanes) {
      Vec acc = vload(o + c);
      for (int64_t r = 0; r < rows; ++r) acc = vfma(vsplat(w[r * kAttnKeys + j]), vload(x + r * ldx + c), acc);
      vstore(o + c, acc);
    }
  }
}

void exp_shifted(const float* s, float shift, float* p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j] = cpu_math::exp_f32(s[j] - shift);
}

}  // namespace

extern const AttentionTiles attention_tiles = {dot_tile, weigh_rows, weigh_cols, exp_shifted};

}  // namespace belay::BELAY_ISA_NS
