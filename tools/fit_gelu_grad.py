#!/usr/bin/env python3
# How the polynomials of GELU's derivative in kernels/cpu/isa/erf_exp.h were obtained (offline;
# not part of the build; needs numpy: python3 -m venv v && v/bin/pip install numpy), as
# tools/fit_erf.py did erf's: Chebyshev least squares in FP64 at 6000 Chebyshev nodes (close to
# minimax), coefficients rounded to FP32, then the kernel emulated in numpy float32 (IEEE add
# and multiply, no FMA, the same order as the C++) against FP64, in the unit of the test's bound
# (tests/kernels/test_cpu_isa.cpp: 6 u (1 + |x| pdf (1 + x^2 / 2)), u = 2^-24).
#   G(x) = cdf(x) + x pdf(x), z = x / sqrt 2 (rounded to FP32 as the kernel does):
#   |z| < 0.875:        G = 0.5 + z R(z^2), R of degree 6 fitted to (G - 0.5) / z
#   0.875 <= |z| < 4.5: H(|z|) = G(|x|) - 1 = |z| e^(-z^2) / sqrt(pi) - erfc(|z|) / 2, degree 16
#                       in |z| - 2.6875; G = 1 + H for x > 0, -H for x < 0
#   |z| >= 4.5:         H = 0
# Tried: the short branch up to |z| = 1.5 (degree 8-10: 3.9-5.2 u there, rounding in Horner over
# a wider s); the long one of degree 15 (4.2 u) or 14 (8 u); the long one to |z| = 5 (4.8 u).
import math
import os
import sys

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_erf import erf, erfc, f32, horner, nodes  # noqa: E402  (erf's fit: the same method and emulation)

ZSHORT, ZLONG, DSHORT, DLONG = 0.875, 4.5, 6, 16

# (G - 0.5) / z = erf(z) / (2 z) + e^(-s) / sqrt(pi) as a polynomial in s = z^2 on [0, ZSHORT^2]
h = ZSHORT**2 / 2
s = h + h * nodes
z = np.sqrt(s)
r_of_u = P.Polynomial(C.cheb2poly(C.chebfit(nodes, 0.5 * erf(z) / z + np.exp(-s) / math.sqrt(math.pi), DSHORT)))
r = r_of_u(P.Polynomial([-1.0, 1.0 / h])).coef.astype(f32)  # u = s / h - 1
# H on [ZSHORT, ZLONG] as a polynomial in t = z - mid (fitted in u = t / w, then rescaled)
mid, w = (ZSHORT + ZLONG) / 2, (ZLONG - ZSHORT) / 2
zz = mid + w * nodes
mono_u = C.cheb2poly(C.chebfit(nodes, zz * np.exp(-zz * zz) / math.sqrt(math.pi) - 0.5 * erfc(zz), DLONG))
hc = np.array([c / w**i for i, c in enumerate(mono_u)]).astype(f32)


def gelu_grad32(x):
    z = (x * f32(0.70710678118654752)).astype(f32)
    az = np.abs(z)
    small = f32(0.5) + z * horner(r, z * z)
    with np.errstate(over="ignore", invalid="ignore"):
        hl = np.where(az >= f32(ZLONG), f32(0), horner(hc, az - f32(mid)))
    big = np.where(z > 0, f32(1) + hl, -hl)
    return np.where(az < f32(ZSHORT), small, big).astype(f32)


pats = np.arange(0, 0x41000000, 89, dtype=np.uint32).view(f32)  # every 89th float below 8
x = np.concatenate([np.linspace(-10, 10, 4_000_001).astype(f32), pats, -pats])
xd = x.astype(np.float64)
pdf = np.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi)
want = 0.5 * erfc(-xd / math.sqrt(2)) + xd * pdf
err = np.abs(gelu_grad32(x).astype(np.float64) - want) / (2.0**-24 * (1 + np.abs(xd) * pdf * (1 + 0.5 * xd * xd)))
print("R (degree 0 first), s = z^2:", ", ".join("%.9e" % v for v in r))
print("H (degree 0 first), t = |z| - %g:" % mid, ", ".join("%.9e" % v for v in hc))
print("G': worst %.3f u (1 + |x| pdf (1 + x^2/2)) at x = %.9g" % (err.max(), x[err.argmax()]))
