// One copy per ISA path (BELAY_ISA_NS, the -m flags: kernels/cpu/isa/isa.cmake). Enough
// independent accumulators to cover the multiply-add latency times the number of FMA ports
// (4 cycles x 2 ports = 8 in flight on Zen 3 and recent Intel cores): 12 on SSE/AVX2 (16
// vector registers), 24 on AVX-512 (32). The loop touches no memory.
#if !defined(BELAY_ISA_NS)
#error "bench/fma_peak.cpp is built once per ISA"
#endif
#include "bench/fma_peak.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

namespace belay::bench::BELAY_ISA_NS {
namespace {

#if defined(BELAY_ISA_avx512) || defined(BELAY_ISA_avx512bf16)
using V = __m512;
constexpr int kLanes = 16, kChains = 24;
inline V splat(float f) { return _mm512_set1_ps(f); }
inline float lane_sum(V v) {  // once per accumulator after the loop: plain code is fine
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, v);
  float s = 0.0f;
  for (float l : lanes) s += l;
  return s;
}
#if defined(BELAY_ISA_avx512bf16)
// VDPBF16PS, the BF16 dot product of the avx512bf16 GEMM: each lane adds two products per
// instruction (4 flops). `a` becomes the pair (a, -a), multiplied by the pair (1, 1): a
// lane gains -a and then a back (odd product first), exactly x0 again, every time.
constexpr int kFlopsPerLane = 4;
inline __m512bh pair_splat(float lo, float hi) {
  uint32_t l, h;
  __builtin_memcpy(&l, &lo, 4);
  __builtin_memcpy(&h, &hi, 4);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>((l >> 16) | (h >> 16) << 16)));
}
#else
constexpr int kFlopsPerLane = 2;
inline V madd(V x, V m, V a) { return _mm512_fmadd_ps(x, m, a); }
#endif
#elif defined(BELAY_ISA_avx2)
using V = __m256;
constexpr int kLanes = 8, kChains = 12, kFlopsPerLane = 2;
inline V madd(V x, V m, V a) { return _mm256_fmadd_ps(x, m, a); }
inline V splat(float f) { return _mm256_set1_ps(f); }
inline float lane_sum(V v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#else
using V = __m128;
constexpr int kLanes = 4, kChains = 12, kFlopsPerLane = 2;
inline V madd(V x, V m, V a) { return _mm_add_ps(_mm_mul_ps(x, m), a); }
inline V splat(float f) { return _mm_set1_ps(f); }
inline float lane_sum(V v) {
  const __m128 t = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif

}  // namespace

PeakRun fma_peak(int64_t iters, float m, float a, float x0) {
  double total = 0.0;
  int threads = 1;
#pragma omp parallel reduction(+ : total)
  {
#pragma omp single
    threads = omp_get_num_threads();
    V acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = splat(x0);
#if defined(BELAY_ISA_avx512bf16)
    (void)m;
    const __m512bh pa = pair_splat(a, -a), pm = pair_splat(1.0f, 1.0f);
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], pa, pm);
    }
#else
    const V vm = splat(m), va = splat(a);
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
      for (int c = 0; c < kChains; ++c) acc[c] = madd(acc[c], vm, va);
    }
#endif
    double s = 0.0;
    for (int c = 0; c < kChains; ++c) s += lane_sum(acc[c]);
    total += s;
  }
  PeakRun r;
  r.flops = static_cast<double>(kFlopsPerLane) * kLanes * kChains * static_cast<double>(iters) * threads;
  r.sum = total;
  r.lanes_total = kLanes * kChains * threads;
  return r;
}

}  // namespace belay::bench::BELAY_ISA_NS
