// The widest float vector of the ISA path a file is built for (isa.cmake defines
// BELAY_ISA_<path> and BELAY_ISA_NS), as a GCC vector: 16 floats on avx512, 8 on avx2, 4 on
// baseline's SSE2, with loads and stores that need no alignment. For the per-ISA kernels that
// write their loops once for every path (attention_tiles.cpp, classifier_rows.cpp).
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/float_vec.h is for the files isa.cmake builds once per ISA"
#endif
#include <immintrin.h>

#include <cstdint>

namespace belay::BELAY_ISA_NS {

#if defined(BELAY_ISA_avx512)
constexpr int kVecWidth = 16;
#elif defined(BELAY_ISA_avx2)
constexpr int kVecWidth = 8;
#else
constexpr int kVecWidth = 4;
#endif
typedef float Vec __attribute__((vector_size(kVecWidth * 4)));                              // a register
typedef float VecInMemory __attribute__((vector_size(kVecWidth * 4), aligned(4), may_alias));  // unaligned

inline Vec vload(const float* p) { return *reinterpret_cast<const VecInMemory*>(p); }  // one unaligned load
inline void vstore(float* p, Vec v) { *reinterpret_cast<VecInMemory*>(p) = v; }
// Every lane x: one broadcast. (Written as Vec{} + x it was an add of +0 first, which GCC must
// keep, since it turns -0 into +0: a scalar add and a broadcast on the FMA ports, where the
// attention tiles' loops are bound.)
inline Vec vsplat(float x) {
#if defined(BELAY_ISA_avx512)
  return reinterpret_cast<Vec>(_mm512_set1_ps(x));
#elif defined(BELAY_ISA_avx2)
  return reinterpret_cast<Vec>(_mm256_set1_ps(x));
#else
  return reinterpret_cast<Vec>(_mm_set1_ps(x));
#endif
}

}  // namespace belay::BELAY_ISA_NS
