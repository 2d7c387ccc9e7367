// What both of a copy's products (gemm_packed.cpp, gemm_amx.cpp) do before their blocks: the
// shape of op(A) op(B), the products with nothing to sum, and the cut of C into one slice per
// OpenMP thread. Included only by files built once per ISA: everything is in BELAY_ISA_NS.
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/gemm_slices.h belongs to a per-ISA copy (BELAY_ISA_NS)"
#endif
#include <omp.h>
#include <stdint.h>

#include "kernels/cpu/isa/gemm_f32.h"

namespace belay::BELAY_ISA_NS {

inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

struct GemmShape {
  int64_t m, n, k;
};
inline GemmShape gemm_shape(const GemmF32Args& g) {
  return {g.trans_a ? g.a_cols : g.a_rows, g.trans_b ? g.b_rows : g.b_cols, g.trans_a ? g.a_rows : g.a_cols};
}

// True when there is nothing to sum (M, N or K zero), C then final: with K = 0 the empty
// sum, C = (accumulate ? C : 0) + bias.
inline bool gemm_done_without_sums(const GemmF32Args& g, const GemmShape& s) {
  if (s.m == 0 || s.n == 0) return true;
  if (s.k != 0) return false;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      float& c = g.c[i * s.n + j];
      c = (g.accumulate ? c : 0.0f) + (g.bias ? g.bias[j] : 0.0f);
    }
  return true;
}

// One slice of C per thread along the longer side, in whole `unit_m` rows or `unit_n`
// columns; a product too small to pay for waking the threads (under ~2 MFLOP) runs on the
// caller alone. Each output is computed by one thread, in the order of its own K loop, so
// the bits do not depend on the thread count.
struct ThreadSlices {
  GemmShape shape;
  bool split_n;
  int64_t threads, per;
  // Thread t's rows [m0, m1) and columns [n0, n1); false when it has none.
  bool slice(int64_t t, int64_t& m0, int64_t& m1, int64_t& n0, int64_t& n1) const {
    const int64_t len = split_n ? shape.n : shape.m, lo = t * per, hi = min64(len, lo + per);
    if (lo >= hi) return false;
    m0 = split_n ? 0 : lo, m1 = split_n ? shape.m : hi, n0 = split_n ? lo : 0, n1 = split_n ? hi : shape.n;
    return true;
  }
};
inline ThreadSlices thread_slices(const GemmShape& s, int64_t unit_m, int64_t unit_n) {
  const bool split_n = s.n >= s.m;
  const int64_t unit = split_n ? unit_n : unit_m, len = split_n ? s.n : s.m;
  int64_t threads = omp_get_max_threads();
  if (2.0 * static_cast<double>(s.m) * s.n * s.k < 2e6) threads = 1;
  threads = min64(threads, (len + unit - 1) / unit);
  const int64_t per = round_up((len + threads - 1) / threads, unit);
  return ThreadSlices{s, split_n, threads, per};
}

}  // namespace belay::BELAY_ISA_NS
