// GELU's tanh form in FP64, and the bound of an FP32 kernel's error on it, derived once for
// the CPU kernels (belay's exp, <= 1.5 ulp: 3 u) and the CUDA ones (expf, <= 2 ulp: 4 u).
//
// The kernels compute y = x s, s the logistic function of 2u, u = c (x + a x^3), through
// e = e^(-2|u|), r = 1 / (1 + e), s = r or e r (element_math.h). In units of 2^-24: u carries
// at most 7 relative (x^3 two roundings, a and c as FP32 constants, the two products and the
// sum, no cancellation since x and a x^3 share a sign), so e carries eta = exp_units + 14 |u|;
// s moves by (1 - s) eta relative through e on either branch, and 1 + e, the quotient, e r and
// x s round once each: |x| s (1 - s) eta + 4 |y|. The derivative g = s + t, t = x (e r r) 2 u':
// s carries s (1 - s) eta + 3 s; t carries eta (e r r = s (1 - s) moves by at most e's own
// error) and 14 roundings (r twice, e r r's two products, u''s six, t's two products); the
// sum one more of |g|. Where e is subnormal (|u| > 43.7, x below -10.2) its relative accuracy
// is gone: it is good to one unit of 2^-149 absolutely (the final rounding onto the subnormal
// grid), which moves y = x e r by |x| 2^-149 and g by (1 + 2 |x u'|) 2^-149; and y and g
// themselves round to that grid (the abs floor of the check). These absolute terms are added
// to the magnitudes divided by 2^-24, so one relative factor of 2^-24 gives them back.
#pragma once
#include <cmath>

namespace belay::test {

struct GeluTanhRef {
  double y, dy;          // the FP64 values, dy for an upstream gradient of 1
  double y_mag, dy_mag;  // the bounds of the FP32 kernels' errors, in units of 2^-24
};

inline GeluTanhRef gelu_tanh_reference(double x, double exp_units) {
  const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
  const double u = c * (x + a * x * x * x);
  const double s = 1.0 / (1.0 + std::exp(-2.0 * u));  // 0.5 (1 + tanh u)
  const double du = c * (1.0 + 3.0 * a * x * x);
  const double t = x * s * (1.0 - s) * 2.0 * du;
  const double eta = exp_units + 14.0 * std::fabs(u);
  const double y = x * s, g = s + t;
  const double subnormal_e = std::ldexp(1.0, -149 + 24);  // one unit of e's grid, in units of 2^-24
  return {y, g, std::fabs(x) * s * (1.0 - s) * eta + 4.0 * std::fabs(y) + std::fabs(x) * subnormal_e,
          std::fabs(g) + 3.0 * s + s * (1.0 - s) * eta + std::fabs(t) * (eta + 14.0) +
              (1.0 + 2.0 * std::fabs(x * du)) * subnormal_e};
}

}  // namespace belay::test
