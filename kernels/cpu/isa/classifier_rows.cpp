// The fused classifier's row for one vector ISA (classifier_rows.h), built once per path by
// isa.cmake with -ffp-contract=off. The 16 lanes of the sums are GCC vectors of the path's width
// (Lanes); the loops over a chunk with exp_f32 are plain loops the compiler vectorizes at the
// path's width (their elements are independent, so the width changes no bit).
// Bytes: reads the B x C logits once (FP32, or 2 bytes for FP16/BF16), writes the FP32
// gradient once and reads it back once from the cache; flops ~ 40 per element (exp_f32 ~ 30,
// the exact difference 6, max, sum and scale ~ 4), one exp per element.
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/classifier_rows.cpp is built once per ISA by isa.cmake"
#endif
#include "kernels/cpu/isa/classifier_rows.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/isa/erf_exp.h"
#include "kernels/cpu/isa/float_vec.h"

namespace belay::BELAY_ISA_NS {
namespace {

using cpu_math::select_f32;

// 16 lanes in kRegs registers of the path's widest float vector (four xmm on baseline's SSE2,
// two ymm on avx2, one zmm on avx512): lane k is element k % kWidth of register k / kWidth.
constexpr int64_t kLanes = 16;
constexpr int64_t kWidth = kVecWidth;  // floats in a register (float_vec.h)
constexpr int64_t kRegs = kLanes / kWidth;
static_assert(kClassifierChunk % kLanes == 0, "whole lanes per chunk");

struct Lanes {
  Vec r[kRegs];
  void to(float (&a)[kLanes]) const { std::memcpy(a, r, sizeof a); }
  void from(const float (&a)[kLanes]) { std::memcpy(r, a, sizeof a); }
};

inline Lanes splat(float x) {
  Lanes l;
  for (int64_t i = 0; i < kRegs; ++i) l.r[i] = Vec{} + x;
  return l;
}

// The lanes added in a fixed tree (8 + 8, 4 + 4, 2 + 2, 1 + 1), the same on every path.
inline float lanes_sum(const Lanes& v) {
  float a[kLanes];
  v.to(a);
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t k = 0; k < w; ++k) a[k] += a[k + w];
  return a[0];
}

// The maximum of x[0, len) and `start`; a NaN element is skipped (m < NaN is false, as in
// std::max(m, x)): the row's exp then gives NaN anyway.
inline float chunk_max(const float* x, int64_t len, float start) {
  Lanes m = splat(start);
  int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes)
    for (int64_t i = 0; i < kRegs; ++i) {
      const Vec v = vload(x + j + i * kWidth);
      m.r[i] = m.r[i] < v ? v : m.r[i];
    }
  float a[kLanes];
  m.to(a);
  for (int64_t k = 0; j + k < len; ++k) a[k] = a[k] < x[j + k] ? x[j + k] : a[k];
  float r = a[0];
  for (int64_t k = 1; k < kLanes; ++k) r = r < a[k] ? a[k] : r;
  return r;
}

// e^(a - b) for a <= b, with the difference taken exactly: a - b = hi + lo (Knuth's TwoSum;
// exact in FP32 while no overflow), e^(hi + lo) = e^hi (1 + lo) to within lo^2, under an ulp.
// Rounding a - b instead would cost a relative error of |a - b| ulps (120 ulps for logits 120
// apart). Arguments below kExpFloor give 0: e^-87 = 1.6e-38 is under FP32's smallest normal,
// a probability no sum of at least 1 (the maximum's own term) can see, and computing it would
// make subnormal intermediates (a microcode assist per lane on x86). -inf - b lands there
// (lo is NaN then, but the select is a bit mask and drops it); a NaN stays NaN.
constexpr float kExpFloor = -87.0f;
inline float exp_diff(float a, float b) {
  const float hi = a - b;
  const float bb = hi - a;
  const float lo = (a - (hi - bb)) + (-b - bb);
  const bool tiny = hi < kExpFloor;
  const float e = cpu_math::exp_f32(select_f32(tiny, kExpFloor, hi));
  return select_f32(tiny, 0.0f, e + e * lo);
}

double row(const float* x, int64_t n, int64_t label, float inv_rows, float* dx, float* scratch) {
  const float x_label = x[label];  // before pass 1, which may overwrite it (dx == x)
  // Pass 1: m is the running maximum, s[k] the sum of lane k's e^(x - m) so far. A chunk that
  // raises m rescales s by e^(old m - new m) first (0 when the old m was -inf: no class seen
  // yet). The chunk's exps are taken against m after the chunk (0 in its place while m is
  // still -inf: its values are -inf or NaN, which give 0 or NaN, as they must), and the chunk
  // remembers that m in scratch for pass 2.
  float m = -INFINITY;
  Lanes s = splat(0.0f);
  for (int64_t c = 0, j0 = 0; j0 < n; ++c, j0 += kClassifierChunk) {
    const int64_t len = n - j0 < kClassifierChunk ? n - j0 : kClassifierChunk;
    const float* xc = x + j0;
    float* ec = dx + j0;
    const float mc = chunk_max(xc, len, m);
    if (mc > m) {
      const float rescale = exp_diff(m, mc);
      for (int64_t i = 0; i < kRegs; ++i) s.r[i] *= rescale;
      m = mc;
    }
    const float ref = m == -INFINITY ? 0.0f : m;
    for (int64_t j = 0; j < len; ++j) ec[j] = exp_diff(xc[j], ref);
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int64_t i = 0; i < kRegs; ++i) s.r[i] += vload(ec + j + i * kWidth);
    if (j < len) {  // the row's last, partial chunk
      float a[kLanes];
      s.to(a);
      for (int64_t k = 0; j + k < len; ++k) a[k] += ec[j + k];
      s.from(a);
    }
    scratch[c] = m;
  }
  const float sum = lanes_sum(s);
  // Pass 2: p = e * (e^(chunk's m - final m) / S), one scale per chunk. A chunk seen while m
  // was -inf holds zeros (or NaNs) and gets scale 0 (exp_diff(-inf, m) is 0), unless the whole
  // row is -inf: then m is -inf too and every scale is NaN, as the FP64 formula's 0/0.
  const float e_label = dx[label];
  float label_scale = 0.0f;
  for (int64_t c = 0, j0 = 0; j0 < n; ++c, j0 += kClassifierChunk) {
    const int64_t len = n - j0 < kClassifierChunk ? n - j0 : kClassifierChunk;
    const float scale = exp_diff(scratch[c], m) / sum;
    float* dc = dx + j0;
    for (int64_t j = 0; j < len; ++j) dc[j] = dc[j] * scale * inv_rows;
    if (label >= j0 && label < j0 + len) label_scale = scale;
  }
  dx[label] = (e_label * label_scale - 1.0f) * inv_rows;
  // loss = log S + m - x[label], the difference in double (exact for FP32 operands) so a
  // small loss under large logits keeps its digits.
  return (static_cast<double>(m) - static_cast<double>(x_label)) + std::log(static_cast<double>(sum));
}

}  // namespace

extern const ClassifierRows classifier_rows = {row};

}  // namespace belay::BELAY_ISA_NS
