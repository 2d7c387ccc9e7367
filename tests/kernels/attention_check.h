// The fused attention op (Backend::attention and attention_backward) against an FP64
// reference of the same already-rounded inputs, through the one tolerance helper, written once
// for any device: tests/kernels/test_attention.cpp runs it on the CPU backend (every ISA path
// this CPU has), tests/gpu/test_cuda_attention.cpp on the CUDA one.
//
// The bounds, element by element, with u = FP32's unit roundoff (each is derived from the
// kernels' arithmetic, never fitted to their results):
//  - a score s_ij = scale q_i.k_j is a sum of d products in FP32: |error| <= e_ij = (d + 1) u
//    scale A_ij, A_ij = sum_c |q_ic k_jc|. A probability p_ij = exp(s_ij - m) / l is off by a
//    relative perr_i = 2 max_j e_ij + (2 Tk + 16) u (the exponent's error both in its numerator
//    and in the normaliser l, l's sum of Tk terms, exp's 2 ulps, the rescalings), plus the
//    input dtype's u where the backend rounds P for the P V product (p_dtype, the CUDA kernels).
//  - out_ic = sum_j p_ij v_jc: sum_j p_ij |v_jc| (perr_i + (Tk + 2) u), then out's rounding.
//  - lse_i = m + log l: max_j e_ij + (Tk + 4) u + 2 u |lse_i|.
//  - backward: p recomputed from lse (perr_i + the lse bound); dP_ij = dO_i.v_j (d terms) and
//    D_i = dO_i.O_i (d terms, O as stored: its rounding too); dS_ij = p_ij (dP_ij - D_i) with
//    the errors of all three; dq = scale sum_j dS_ij k_j (Tk terms), dk = scale sum_i dS_ij q_i
//    and dv = sum_i p_ij dO_i (Tq terms), then each gradient's rounding.
//  - where the backend rounds P and dS to p_dtype for its products (the tensor cores), each
//    rounding is off by u_p |x| (in perr and in dS's bound) plus, below p_dtype's smallest
//    normal, up to half its smallest subnormal (eta_p: FP16's 2^-25, an absolute error that a
//    16-bit output's own tolerance hides but an FP32 gradient's does not).
//  - `flush` (the CPU's AMX tiles, TDPBF16PS): an input below FP32's smallest normal t = 2^-126
//    reads as zero and a running sum below t is flushed to zero, so each product term a b of a
//    tile sum may be off by t (|a| + |b| + 1) more; and a rounded P or dS below t reads as zero,
//    so eta_p becomes t.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "engine/backend.h"
#include "tests/kernels/math_ops_check.h"

namespace belay::test::attention {

using math::host;
using math::kMathDtypes;
using math::make;
using math::values;

struct Case {
  int64_t items, tq, tk, d;
  bool causal;
};

inline bool sees(const Case& c, int64_t i, int64_t j) { return !c.causal || j <= i + c.tk - c.tq; }

// The FP64 reference of one case: the forward, the backward from dout, and the error bound of
// every output (the header's comment). `o_stored` is the forward's out as the backend stored it
// (the backward's D reads it); p_dtype: where the backend rounds P (and dS) for its products.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<double> out_err, lse_err, dq_err, dk_err, dv_err;
};

inline Reference reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const std::vector<float>& dout, const std::vector<float>& o_stored,
                           float scale, DType dtype, DType p_dtype, bool flush = false) {
  const double u = unit_roundoff(DType::F32), u_p = p_dtype == DType::F32 ? 0.0 : unit_roundoff(p_dtype);
  const double t = flush ? static_cast<double>(finfo(DType::F32).smallest_normal) : 0.0;
  const double eta_p =
      flush ? t : p_dtype == DType::F32 ? 0.0 : 0.5 * static_cast<double>(finfo(p_dtype).smallest_subnormal);
  const double u_out = dtype == DType::F32 ? 0.0 : unit_roundoff(dtype);
  const int64_t d = c.d, nq = c.items * c.tq * d, nk = c.items * c.tk * d;
  Reference r;
  r.out.assign(nq, 0.0), r.out_err.assign(nq, 0.0), r.dq.assign(nq, 0.0), r.dq_err.assign(nq, 0.0);
  r.lse.assign(c.items * c.tq, 0.0), r.lse_err.assign(c.items * c.tq, 0.0);
  r.dk.assign(nk, 0.0), r.dk_err.assign(nk, 0.0), r.dv.assign(nk, 0.0), r.dv_err.assign(nk, 0.0);
  std::vector<double> p(c.tk), e(c.tk), dpv(c.tk), dpe(c.tk);
  for (int64_t it = 0; it < c.items; ++it)
    for (int64_t i = 0; i < c.tq; ++i) {
      const float* qi = &q[(it * c.tq + i) * d];
      const float* gi = &dout[(it * c.tq + i) * d];
      const float* oi = &o_stored[(it * c.tq + i) * d];
      const int64_t row = it * c.tq + i;
      double mx = -INFINITY, emax = 0.0;
      for (int64_t j = 0; j < c.tk; ++j) {
        const float* kj = &k[(it * c.tk + j) * d];
        double s = 0.0, a = 0.0, f = 0.0;
        for (int64_t x = 0; x < d; ++x) {
          s += double(qi[x]) * kj[x], a += std::fabs(double(qi[x]) * kj[x]);
          f += t * (std::fabs(qi[x]) + std::fabs(kj[x]) + 1.0);
        }
        p[j] = s * scale;
        e[j] = (d + 1) * u * scale * a + scale * f;
        if (sees(c, i, j)) mx = std::max(mx, p[j]), emax = std::max(emax, e[j]);
      }
      double l = 0.0;
      for (int64_t j = 0; j < c.tk; ++j) l += sees(c, i, j) ? std::exp(p[j] - mx) : 0.0;
      if (l == 0.0) {  // sees no key: out 0, lse -inf, no gradient
        r.lse[row] = -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < c.tk; ++j) p[j] = sees(c, i, j) ? std::exp(p[j] - mx) / l : 0.0;
      r.lse[row] = mx + std::log(l);
      r.lse_err[row] = emax + (c.tk + 4) * u + 2 * u * std::fabs(r.lse[row]);
      const double perr = 2 * emax + (2 * c.tk + 16) * u + u_p;
      const double perr_bwd = perr + r.lse_err[row];
      double dsum = 0.0, dsum_mag = 0.0;
      for (int64_t x = 0; x < d; ++x) dsum += double(gi[x]) * oi[x], dsum_mag += std::fabs(double(gi[x]) * oi[x]);
      for (int64_t x = 0; x < d; ++x) {
        double o = 0.0, mag = 0.0, sub = 0.0;
        for (int64_t j = 0; j < c.tk; ++j) {
          o += p[j] * v[(it * c.tk + j) * d + x];
          mag += p[j] * std::fabs(v[(it * c.tk + j) * d + x]);
          if (sees(c, i, j)) sub += eta_p * std::fabs(v[(it * c.tk + j) * d + x]);
        }
        // (flush: each seen term's p_j (<= 1) v_j before the division by l >= 1)
        r.out[row * d + x] = o;
        r.out_err[row * d + x] = mag * (perr + (c.tk + 2) * u) + sub + 2 * t * c.tk + u_out * std::fabs(o);
      }
      // D's error: its d products in FP32, and O's own rounding into its dtype.
      const double dsum_err = (d + 1) * u * dsum_mag + 2 * u_out * dsum_mag;
      for (int64_t j = 0; j < c.tk; ++j) {
        if (p[j] == 0.0) continue;
        const float* vj = &v[(it * c.tk + j) * d];
        double dp = 0.0, dmag = 0.0, dflush = 0.0;
        for (int64_t x = 0; x < d; ++x) {
          dp += double(gi[x]) * vj[x], dmag += std::fabs(double(gi[x]) * vj[x]);
          dflush += t * (std::fabs(gi[x]) + std::fabs(vj[x]) + 1.0);
        }
        const double ds = p[j] * (dp - dsum);
        // (the exact D equals dsum: sum_j p_ij dP_ij = dO_i . O_i)
        const double ds_err = p[j] * (perr_bwd * std::fabs(dp - dsum) + (d + 1) * u * dmag + dflush + dsum_err) +
                              (u + u_p) * std::fabs(ds) + eta_p;
        const float* kj = &k[(it * c.tk + j) * d];
        for (int64_t x = 0; x < d; ++x) {
          const int64_t qx = row * d + x, kx = (it * c.tk + j) * d + x;
          r.dq[qx] += scale * ds * kj[x];
          const double term_flush = t * (std::fabs(ds) + ds_err + 1.0);  // DAZ of k or q, FTZ of the sum
          r.dq_err[qx] += scale * (ds_err * std::fabs(kj[x]) + (c.tk + 2) * u * std::fabs(ds * kj[x]) + term_flush);
          r.dk[kx] += scale * ds * qi[x];
          r.dk_err[kx] += scale * (ds_err * std::fabs(qi[x]) + (c.tq + 2) * u * std::fabs(ds * qi[x]) + term_flush);
          r.dv[kx] += p[j] * gi[x];
          r.dv_err[kx] += p[j] * std::fabs(gi[x]) * (perr_bwd + (c.tq + 2) * u) + eta_p * std::fabs(gi[x]) +
                          t * (p[j] + 1.0);  // (flush: DAZ of dO, FTZ of the sum)
        }
      }
    }
  return r;
}

// |got - ref| <= err + the dtype's rounding of ref + its smallest normal, element by element.
inline void check_within(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                         const std::vector<double>& err, DType dtype) {
  INFO(what);
  const double u = dtype == DType::F32 ? 0.0 : unit_roundoff(dtype);
  std::vector<double> bound(err.size());
  for (size_t i = 0; i < err.size(); ++i) bound[i] = err[i] + u * std::fabs(ref[i]);
  check_close(got, ref, Tolerance{1.0, static_cast<double>(finfo(dtype).smallest_normal)}, bound);
}

inline void check_lse(const std::vector<float>& got, const Reference& r) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(r.lse[i])) bad += !(std::isinf(got[i]) && got[i] < 0);
    else bad += !(std::fabs(got[i] - r.lse[i]) <= r.lse_err[i]);
  }
  INFO("lse: " << bad << " of " << got.size() << " rows outside the bound");
  CHECK(bad == 0);
}

// What one run gave: the forward's and the backward's outputs on the host.
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

inline Outputs run(const Backend& be, const Case& c, DType dt, DType grad_dt, Device dev, const std::vector<float>& qv,
                   const std::vector<float>& kv, const std::vector<float>& vv, const std::vector<float>& gv,
                   float scale) {
  const Shape sq{c.items, c.tq, c.d}, sk{c.items, c.tk, c.d};
  const Tensor q = make(qv, sq, dt, dev), k = make(kv, sk, dt, dev), v = make(vv, sk, dt, dev);
  const Tensor g = make(gv, sq, dt, dev);
  Tensor out = Tensor::empty(sq, dt, dev), lse = Tensor::empty(Shape{c.items, c.tq}, DType::F32, dev);
  be.attention(q, k, v, c.causal, scale, out, lse);
  Tensor dq = Tensor::empty(sq, grad_dt, dev), dk = Tensor::empty(sk, grad_dt, dev), dv = Tensor::empty(sk, grad_dt, dev);
  be.attention_backward(q, k, v, out, lse, g, c.causal, scale, dq, dk, dv);
  return {host(out), host(lse), host(dq), host(dk), host(dv)};
}

// One case in one dtype: forward and backward against the reference. Returns what it got, for
// the callers that compare bits across runs.
// grads: the gradients' dtype, dt unless given (FP32; the rounding allowance follows it).
// What computes a case's outputs when not the device's backend (run): the same arguments.
using Runner = std::function<Outputs(const Case& c, DType dt, DType grad_dt, const std::vector<float>& q,
                                     const std::vector<float>& k, const std::vector<float>& v,
                                     const std::vector<float>& dout, float scale)>;

// flush: the backend's tiles flush (reference()'s `flush`: the CPU's AMX path). runner: computes
// the outputs instead of dev's backend (the CPU's AMX code on the tile emulator).
inline Outputs check_case(Device dev, const Case& c, DType dt, DType p_dtype = DType::F32,
                          std::optional<DType> grads = std::nullopt, bool flush = false, const Runner& runner = {}) {
  const DType grad_dt = grads.value_or(dt);
  INFO("attention items " << c.items << " Tq " << c.tq << " Tk " << c.tk << " d " << c.d
                          << (c.causal ? " causal" : "") << " in " << dtype_name(dt) << ", gradients in "
                          << dtype_name(grad_dt) << " on " << dev.str());
  const uint64_t seed = static_cast<uint64_t>(c.items * 1000003 + c.tq * 1009 + c.tk * 101 + c.d * 7 + c.causal);
  const std::vector<float> qv = values(c.items * c.tq * c.d, seed, dt), kv = values(c.items * c.tk * c.d, seed + 1, dt);
  const std::vector<float> vv = values(c.items * c.tk * c.d, seed + 2, dt), gv = values(c.items * c.tq * c.d, seed + 3, dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const Outputs got = runner ? runner(c, dt, grad_dt, qv, kv, vv, gv, scale)
                             : run(backend_for(dev), c, dt, grad_dt, dev, qv, kv, vv, gv, scale);
  const Reference r = reference(c, qv, kv, vv, gv, got.out, scale, dt, p_dtype, flush);
  check_within("out", got.out, r.out, r.out_err, dt);
  check_lse(got.lse, r);
  check_within("dq", got.dq, r.dq, r.dq_err, grad_dt);
  check_within("dk", got.dk, r.dk, r.dk_err, grad_dt);
  check_within("dv", got.dv, r.dv, r.dv_err, grad_dt);
  return got;
}

// The shapes of the issue: T in {1, 7, 64, 65, 200}, d in {16, 32, 64, 128} and an odd 40,
// items not a multiple of anything, Tq != Tk (the KV cache's one query against 65 keys, and more
// queries than keys: the first rows see nothing), causal and not.
inline std::vector<Case> cases(bool small) {
  std::vector<Case> out;
  for (bool causal : {false, true}) {
    for (int64_t t : {1, 7, 64, 65}) out.push_back({3, t, t, 32, causal});
    for (int64_t d : {16, 40, 64, 128}) out.push_back({2, 33, 33, d, causal});
    out.push_back({1, 1, 65, 64, causal});
    out.push_back({2, 70, 9, 16, causal});
    if (!small) out.push_back({2, 200, 200, 64, causal});
  }
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline bool same_bits(const Outputs& a, const Outputs& b) {
  return same_bits(a.out, b.out) && same_bits(a.lse, b.lse) && same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dv, b.dv);
}

}  // namespace belay::test::attention
