// belay's own FP32 erf and exp for the CPU element kernels (GELU, its tanh form and their
// gradients), written
// with basic IEEE operations only: add, multiply, compare-and-select, a float -> int
// conversion of a value already integral, and integer bit manipulation for the 2^n scale.
// No libm call and no branch, so a plain loop over them vectorizes; and since every path
// (element_blocks.cpp, built per ISA with -ffp-contract=off) does the same operations in the
// same order, every path gives the baseline's bits. glibc's erff/expf cost ~6-12 ms per
// million elements on one core because they do not vectorize.
//
// Every function is `static inline`: each translation unit (each ISA's copy of
// element_blocks.cpp, and the tests) keeps its own, so no copy built with wider -m flags is
// shared by name (the one-definition rule, docs/toolchain.md).
//
// The polynomials were fitted offline (tools/fit_erf.py: Chebyshev least squares in FP64,
// near minimax) and their errors measured with the kernel emulated in FP32 over a dense sweep:
//   erf:  |error| <= 1.2e-7 absolute over all finite inputs (GELU adds erf to 1, so absolute
//         accuracy is what it needs; the float rounding of results near 0.8 is 2 ulps of it).
//   exp:  <= 1.2 ulps relative where the result is normal; 0 below e^-104, inf above e^89.
// tests/kernels/test_cpu_isa.cpp checks these bounds against FP64 std::erf/std::exp.
#pragma once
#include <cstdint>

#include "engine/half_bits.h"

namespace belay::cpu_math {

static inline float abs_f32(float x) { return f32_from_bits(f32_bits(x) & 0x7fffffffu); }

// c ? a : b, as a bit mask: both a and b are always computed and used, so the compiler has
// no branch to make. (Written as ?:, g++ moves a long polynomial used only on one side into
// a branch, and under its default -ftrapping-math it may not compute it on every lane again,
// so the AVX2 loop stays scalar; AVX-512 gets by with masked operations.)
static inline float select_f32(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return f32_from_bits((f32_bits(a) & m) | (f32_bits(b) & ~m));
}

// The polynomial c[0] t^(N-1) + ... + c[N-1] (highest degree first) by Horner's rule: a multiply
// then an add per coefficient, in that order (-ffp-contract=off keeps them two roundings: every
// path's bits). Unrolled, so a loop calling it on every lane still vectorizes.
template <int N>
static inline float horner(float t, const float (&c)[N]) {
  float r = c[0];
#pragma GCC unroll 32
  for (int i = 1; i < N; ++i) r = r * t + c[i];
  return r;
}

// e^x. Range reduction x = k ln2 + r with k = round(x / ln2), |r| <= ln2 / 2: ln2 in two
// parts (Cody and Waite), the high part with 16 trailing zero bits, so k * kLn2Hi is exact
// for |k| < 2^8 and x - k * kLn2Hi is exact; e^r by its Taylor polynomial of degree 7
// (truncation error 0.35^8 / 8! = 5e-9 relative, under 0.1 ulp; the rest is rounding).
// MulAdd::f(a, b, c) is each a * b + c of the range reduction and the polynomial: PlainMulAdd,
// a multiply then an add (two roundings: every path's bits, exp_f32), or a caller's fused one
// (attention_tiles.cpp on the FMA paths: fewer operations, one rounding each, its own bits).
struct PlainMulAdd {
  static float f(float a, float b, float c) { return a * b + c; }
};
template <class MulAdd>
static inline float exp_f32_with(float x) {
  // Clamp first: below -104 the result rounds to 0 (e^-104 < 2^-150), above 89 it is inf
  // (e^89 > FLT_MAX), and the clamped values keep k within the integer conversion's range.
  // NaN is replaced by 0 for the arithmetic (no float -> int conversion of NaN) and put
  // back at the end.
  float xc = select_f32(x < -104.0f, -104.0f, x);
  xc = select_f32(xc > 89.0f, 89.0f, xc);
  xc = select_f32(x != x, 0.0f, xc);
  // Round to nearest (even) by adding and subtracting 1.5 * 2^23: at that size the float's
  // last mantissa bit is worth 1, so the addition rounds away the fraction (|x/ln2| < 2^22).
  const float kRound = 12582912.0f;
  const float k = MulAdd::f(xc, 1.44269504088896341f, kRound) - kRound;
  const float kLn2Hi = 0.693145751953125f;       // 0x3f317200
  const float kLn2Lo = 1.42860682030941723212e-6f;  // ln2 - kLn2Hi
  const float r = MulAdd::f(-k, kLn2Lo, MulAdd::f(-k, kLn2Hi, xc));
  float p = 1.0f / 5040.0f;
  p = MulAdd::f(p, r, 1.0f / 720.0f);
  p = MulAdd::f(p, r, 1.0f / 120.0f);
  p = MulAdd::f(p, r, 1.0f / 24.0f);
  p = MulAdd::f(p, r, 1.0f / 6.0f);
  p = MulAdd::f(p, r, 0.5f);
  p = MulAdd::f(p, r, 1.0f);
  p = MulAdd::f(p, r, 1.0f);
  // p * 2^k, with 2^k as two normal powers of two 2^a * 2^b (k in [-150, 129]: a and b in
  // [-75, 65]): p * 2^a is exact, and the second product rounds once, to a subnormal or to
  // inf where the true result is one.
  const int32_t n = static_cast<int32_t>(k);
  const int32_t a = n / 2, b = n - a;
  const float scale_a = f32_from_bits(static_cast<uint32_t>(a + 127) << 23);
  const float scale_b = f32_from_bits(static_cast<uint32_t>(b + 127) << 23);
  const float y = p * scale_a * scale_b;
  return select_f32(x != x, x, y);
}
static inline float exp_f32(float x) { return exp_f32_with<PlainMulAdd>(x); }

// erf(x), odd: computed on |x| and the sign put back.
//   |x| < 0.875:       x * P(x^2), P of degree 5 (erf(x)/x is even and smooth there).
//   0.875 <= |x| < 4:  1 - Q(|x| - 2.4375), Q of degree 15 fitted to erfc on [0.875, 4]:
//                      Q is small (<= 0.22), so its rounding errors are small in absolute
//                      terms, and the shifted variable (|t| <= 1.57) keeps Horner stable.
//   |x| >= 4:          +-1 (erfc(4) = 1.5e-8, a quarter of an ulp below 1).
// NaN propagates through the polynomial (every comparison with it is false), +-inf gives
// +-1, -0 gives -0, subnormals give x * 1.128... (the first branch).
// The two branches are separate functions so that a caller may evaluate the second only on
// the values that need it (element_blocks.cpp's erf_block on AVX-512); erf_f32 takes both and
// selects, so every caller gets the same bits.
static constexpr float kErfSmall[] = {-6.218503113e-04f, 5.035122391e-03f, -2.679345198e-02f,
                                      1.128251031e-01f,  -3.761255443e-01f, 1.128379107e+00f};
static inline float erf_small(float x) {  // |x| < 0.875
  return x * horner(x * x, kErfSmall);
}

static constexpr float kErfcLarge[] = {
    3.037208103e-07f,  -1.164749506e-06f, -2.163861154e-06f, 1.777209764e-05f, -2.169865365e-05f, -7.031443965e-05f,
    3.034582769e-04f,  -4.167796578e-04f, -3.788192407e-04f, 3.003260354e-03f, -7.205594331e-03f, 1.070188079e-02f,
    -1.075886097e-02f, 7.229083218e-03f,  -2.965739695e-03f, 5.665420904e-04f};
static inline float erf_large(float x) {  // |x| >= 0.875, and NaN
  const float ax = abs_f32(x);
  float big = 1.0f - horner(ax - 2.4375f, kErfcLarge);
  big = select_f32(ax >= 4.0f, 1.0f, big);
  return f32_from_bits(f32_bits(big) | (f32_bits(x) & 0x80000000u));  // big >= 0: OR in x's sign
}

// Which branch erf_f32 takes for x: the small one exactly where |x| < 0.875 (a NaN takes the
// large one, where it propagates).
static inline bool erf_takes_small(float x) { return abs_f32(x) < 0.875f; }

static inline float erf_f32(float x) { return select_f32(erf_takes_small(x), erf_small(x), erf_large(x)); }

// GELU's and its gradient's argument of erf: x / sqrt 2.
static inline float gelu_erf_arg(float x) { return x * 0.70710678118654752f; }

// GELU, the exact form PyTorch uses by default (approximate='none'), in the order of
// kernels/common/element_math.h: 0.5 x (1 + erf(x / sqrt 2)). Below x = -8, erf is -1
// exactly, so the product is already -0 for every finite x; the select only changes
// x = -inf, where the formula gives -inf * 0 = NaN, to its limit -0 (PyTorch returns NaN
// there, an open bug on their side; +inf gives +inf here as the formula does).
// gelu_from_erf takes e = erf_f32(gelu_erf_arg(x)), however the caller computed it.
static inline float gelu_from_erf(float x, float e) {
  const float y = 0.5f * x * (1.0f + e);
  return select_f32(x < -8.0f, -0.0f, y);
}
static inline float gelu(float x) { return gelu_from_erf(x, erf_f32(gelu_erf_arg(x))); }

// GELU's derivative G(x) = cdf(x) + x pdf(x), pdf(x) = e^(-x^2/2) / sqrt(2 pi), from the same
// argument z = x / sqrt 2 as GELU's erf, but with neither erf nor exp: G is smooth, so it gets
// polynomials of its own (tools/fit_gelu_grad.py; the same fitting and FP32 emulation as erf's):
//   |z| < 0.875:         G = 0.5 + z R(z^2), R of degree 6 (G - 1/2 is odd in x).
//   0.875 <= |z| < 4.5:  H(|z|) = G(|x|) - 1 = |z| e^(-z^2) / sqrt(pi) - erfc(|z|) / 2 as a
//                        polynomial of degree 16 in |z| - 2.6875; G = 1 + H for x > 0 and
//                        G = -H for x < 0 (G(-x) = 1 - G(x)), so the small negative side
//                        keeps its digits.
//   |z| >= 4.5:          1 for x > 0, -0 for x < 0 (H(4.5) = 4e-9, a thirtieth of an ulp of 1).
// Measured over every 89th float pattern below 8 in magnitude and a sweep of [-10, 10], against
// FP64: within 2.5 u (1 + |x| pdf (1 + x^2 / 2)), u = 2^-24, where the bound of the test is 6.
// The short branch takes 15 operations a value; the erf-and-exp form it replaced took about 65
// and an exp on every value (GELU' ran at 2.0-2.1x PyTorch's time on N(0, 1) values on the AMX
// Xeon, 1.5-1.6x on N(0, 0.3); 1.3-1.4x and 0.65-0.77x now).
// +inf gives 1 and -inf -0 (the limits), +-0 gives 0.5; a NaN z takes the long branch and
// gives NaN. The branches are separate functions for element_blocks.cpp's block loop (the long
// one only where needed), as erf's are; gelu_grad takes both and selects.
static constexpr float kGeluGradSmall[] = {5.806430127e-04f,  -4.870417062e-03f, 2.598953620e-02f, -1.074304730e-01f,
                                           3.385094404e-01f,  -7.522525787e-01f, 1.128379107e+00f};
static inline float gelu_grad_small(float z) {  // |z| < 0.875
  return 0.5f + z * horner(z * z, kGeluGradSmall);
}

static constexpr float kGeluGradLarge[] = {
    4.378011056e-07f,  -7.684044476e-07f, -7.172171536e-06f, 1.928122037e-05f,  2.988569213e-05f, -1.694169769e-04f,
    1.669667981e-04f,  3.740861430e-04f,  -1.510559698e-03f, 2.265128773e-03f,  -4.200376570e-04f, -5.395585671e-03f,
    1.249526814e-02f,  -1.531495526e-02f, 1.155992132e-02f,  -5.124497693e-03f, 1.034503919e-03f};
static inline float gelu_grad_large(float z) {  // |z| >= 0.875, and NaN
  const float az = abs_f32(z);
  float h = horner(az - 2.6875f, kGeluGradLarge);
  h = select_f32(az >= 4.5f, 0.0f, h);  // also +-inf, where t's powers overflow
  return select_f32(z > 0.0f, 1.0f + h, -h);
}

static inline float gelu_grad(float x) {
  const float z = gelu_erf_arg(x);
  return select_f32(erf_takes_small(z), gelu_grad_small(z), gelu_grad_large(z));
}

// GELU's tanh form, in the order of kernels/common/element_math.h's gelu_tanh_f32: x s, s
// the logistic function of 2u, u = sqrt(2 / pi) (x + 0.044715 x^3), through e = e^(-2|u|) in
// [0, 1]: s = 1 / (1 + e) for u >= 0, e / (1 + e) for u < 0. The select gives -inf the limit
// -0 (every finite x below -10.5 gives -0 already: e is 0 there), and a NaN x comes back as
// it is (x s has two NaN operands then, and which one a product keeps depends on the
// registers, which differ between the SSE and AVX code).
static inline float gelu_tanh(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * (x * x * x));
  const float e = exp_f32(-2.0f * abs_f32(u));
  const float r = 1.0f / (1.0f + e);
  const float s = select_f32(u < 0.0f, e * r, r);
  return select_f32(x != x, x, select_f32(x < -20.0f, -0.0f, x * s));
}

// Its derivative s + x (e r r) 2 u', as gelu_tanh_grad_f32: r = 1 / (1 + e), e r r =
// s (1 - s), u' = sqrt(2 / pi) (1 + 0.134145 x^2). Beyond |x| = 20 the limits 1 and 0; NaN as
// it is.
static inline float gelu_tanh_grad(float x) {
  const float x2 = x * x;
  const float u = 0.79788456080286536f * (x + 0.044715f * (x2 * x));
  const float du = 0.79788456080286536f * (1.0f + 0.134145f * x2);
  const float e = exp_f32(-2.0f * abs_f32(u));
  const float r = 1.0f / (1.0f + e);
  const float s = select_f32(u < 0.0f, e * r, r);
  const float g = s + x * (e * r * r) * 2.0f * du;
  const float limit = select_f32(x > 0.0f, 1.0f, 0.0f);
  return select_f32(x != x, x, select_f32(abs_f32(x) > 20.0f, limit, g));
}

}  // namespace belay::cpu_math
