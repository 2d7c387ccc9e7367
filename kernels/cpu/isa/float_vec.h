// The widest float vector of the ISA path a file is built for (isa.cmake defines
// BELAY_ISA_<path> and BELAY_ISA_NS), as a GCC vector: 16 floats on avx512, 8 on avx2, 4 on
// baseline's SSE2, with loads and stores that need no alignment. For the per-ISA kernels that
// write their loops once for every path (attention_tiles.cpp, classifier_rows.cpp).
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/float_vec.h is for the files isa.cmake builds once per ISA"
#endif
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
inline Vec vsplat(float x) { return Vec{} + x; }

}  // namespace belay::BELAY_ISA_NS
