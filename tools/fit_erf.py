#!/usr/bin/env python3
# How the polynomials of kernels/cpu/isa/erf_exp.h were obtained (offline; not part of the
# build; needs numpy: python3 -m venv v && v/bin/pip install numpy). Chebyshev least squares
# in FP64 at 6000 Chebyshev nodes (close to minimax), coefficients rounded to FP32, then the
# kernel emulated in numpy float32 (IEEE add and multiply, no FMA, the same order as the C++)
# over a dense sweep, against math.erf / numpy's FP64 exp.
#   erf, |x| < 0.875:     x * P(x^2), P of degree 5
#   erf, 0.875..4:        1 - Q(|x| - 2.4375), Q of degree 15 fitted to erfc
#   exp:                  Taylor of degree 7 on |r| <= ln2/2 (no fit needed)
import math

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P

f32 = np.float32
erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)
nodes = np.cos(np.pi * (np.arange(6000) + 0.5) / 6000)  # in [-1, 1]


def horner(c, t):
    r = np.full_like(t, c[-1])
    for ci in c[-2::-1]:
        r = r * t + ci  # two FP32 roundings, as with -ffp-contract=off
    return r


def fit_erf():
    # erf(x)/x as a polynomial in s = x^2 on [0, 0.875^2]
    s = 0.875**2 * (0.5 + 0.5 * nodes)
    ps = P.polyfit(s, erf(np.sqrt(s)) / np.sqrt(s), 5).astype(f32)
    # erfc on [0.875, 4] as a polynomial in t = x - 2.4375 (fitted in u = t / h, then rescaled)
    lo, hi = 0.875, 4.0
    mid, h = (lo + hi) / 2, (hi - lo) / 2
    mono_u = C.cheb2poly(C.chebfit(nodes, erfc(mid + h * nodes), 15))
    q = np.array([c / h**i for i, c in enumerate(mono_u)]).astype(f32)

    def erf32(x):
        ax = np.abs(x)
        small = x * horner(ps, x * x)
        big = np.where(ax >= f32(4), f32(1), f32(1) - horner(q, ax - f32(mid)))
        return np.where(ax < f32(lo), small, np.copysign(big, x))

    x = np.concatenate([np.linspace(0, 6, 3_000_001).astype(f32),
                        np.arange(0, 0x40A00000, 97, dtype=np.uint32).view(f32)])  # every 97th float in [0, 5)
    err = np.abs(erf32(x).astype(np.float64) - erf(x.astype(np.float64)))
    print("P (degree 0 first):", ", ".join("%.9e" % v for v in ps))
    print("Q (degree 0 first), t = |x| - %g:" % mid, ", ".join("%.9e" % v for v in q))
    print("erf: worst absolute error %.3g at x = %.9g" % (err.max(), x[err.argmax()]))


if __name__ == "__main__":
    fit_erf()
