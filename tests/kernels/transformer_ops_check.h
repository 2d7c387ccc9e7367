// The transformer's backend ops (embedding and its backward, LayerNorm and its backward)
// against FP64 references of the same already-rounded inputs, through the one tolerance
// helper, in FP32, FP16 and BF16. Written once for any device (as math_ops_check.h):
// tests/kernels/test_math_kernels.cpp runs it on the CPU backend, tests/gpu/test_cuda_transformer.cpp
// on the CUDA one.
//
// The bounds (u = FP32's unit roundoff; every result is then rounded once into its dtype):
//  - embedding: a copy, bit for bit. Its backward adds k FP32 values into a row (k = how
//    often the id occurs) onto its old value: the sum bound with n = k + 1 against
//    |old| + sum |dout|.
//  - LayerNorm forward: the mean and the variance are sums of `cols` terms in FP32 (n = cols
//    each), then a division, a sqrt and a reciprocal; y = xhat w + b adds 3 roundings. The
//    error of the statistics moves xhat by about n u (|xhat| + M), M = mean|x - mean| rstd + 1
//    (the mean's error is relative to mean |x|, not to x - mean): magnitude
//    (|xhat| + M) |w| + |b| with n = cols + 8.
//  - LayerNorm backward: dx = rstd (g - mean(g) - xhat mean(g xhat)), two more sums of `cols`
//    terms on top of the statistics: magnitude rstd (|g| + (1 + |xhat| + M)(mean|g| +
//    mean|g xhat|)) with n = 2 cols + 8. dweight = sum over rows of dy xhat (rows terms, each
//    xhat off by the statistics' error): magnitude sum |dy| (|xhat| + M), n = rows + cols + 8;
//    dbias = sum of dy: sum |dy|, n = rows.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "tests/kernels/math_ops_check.h"

namespace belay::test::transformer {

using math::host;
using math::kMathDtypes;
using math::make;
using math::values;

// ids with repeats, in no order: row r picks (r * 7 + r / 3) % vocab.
inline std::vector<float> repeated_ids(int64_t n, int64_t vocab) {
  std::vector<float> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) ids[r] = static_cast<float>((r * 7 + r / 3) % vocab);
  return ids;
}

inline void check_embedding(Device dev) {
  const Backend& be = backend_for(dev);
  const int64_t vocab = 11, dim = 37, n = 50;
  const std::vector<float> idv = repeated_ids(n, vocab);
  const Tensor ids = make(idv, Shape{n}, DType::F32, dev);
  for (DType dt : kMathDtypes) {
    INFO("embedding in " << dtype_name(dt) << " on " << dev.str());
    const std::vector<float> tv = values(vocab * dim, 51, dt);
    const Tensor table = make(tv, Shape{vocab, dim}, dt, dev);
    Tensor out = Tensor::empty(Shape{n, dim}, dt, dev);
    be.embedding(table, ids, out);
    const std::vector<float> got = host(out);
    int64_t differ = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < dim; ++c) differ += f32_bits(got[r * dim + c]) != f32_bits(tv[idv[r] * dim + c]);
    CHECK(differ == 0);

    const std::vector<float> gv = values(n * dim, 52, dt), old = values(vocab * dim, 53, DType::F32);
    Tensor dtable = make(old, Shape{vocab, dim}, DType::F32, dev);
    be.embedding_backward(make(gv, Shape{n, dim}, dt, dev), ids, dtable);
    std::vector<double> ref(old.begin(), old.end()), mag(old.size());
    std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
    for (size_t i = 0; i < old.size(); ++i) mag[i] = std::fabs(old[i]);
    for (int64_t r = 0; r < n; ++r) {
      ++count[idv[r]];
      for (int64_t c = 0; c < dim; ++c) {
        ref[idv[r] * dim + c] += gv[r * dim + c];
        mag[idv[r] * dim + c] += std::fabs(gv[r * dim + c]);
      }
    }
    int64_t most = 0;
    for (int64_t k : count) most = std::max(most, k);
    check_close(host(dtable), ref, tolerance_for(dt, DType::F32, most + 1), mag);
  }
}

// An id that is not a row: out of range, negative, not an integer. An Error, naming it (the
// backends that read ids on the host; the CUDA backend's NaN rows are its own test's).
inline void check_embedding_bad_ids(Device dev) {
  const Backend& be = backend_for(dev);
  const int64_t vocab = 11, dim = 37;
  const Tensor table = make(values(vocab * dim, 54, DType::F32), Shape{vocab, dim}, DType::F32, dev);
  Tensor out = Tensor::empty(Shape{2, dim}, DType::F32, dev);
  for (float bad : {11.0f, -1.0f, 2.5f, NAN}) {
    INFO("id " << bad);
    CHECK_THROWS_WITH(be.embedding(table, make({0.0f, bad}, Shape{2}, DType::F32, dev), out),
                      Catch::Contains("at position 1") && Catch::Contains("[0, 11)"));
  }
}

struct NormCase {
  int64_t rows, cols;
  bool affine;
};

// Forward and backward of one case in dtype dt (x, dy and y, dx; weight and bias in wdt).
inline void check_layer_norm_case(Device dev, const NormCase& c, DType dt, DType wdt) {
  const Backend& be = backend_for(dev);
  INFO("layer_norm " << c.rows << " x " << c.cols << (c.affine ? " affine" : "") << " in " << dtype_name(dt)
                     << " (weights " << dtype_name(wdt) << ") on " << dev.str());
  const int64_t n = c.rows * c.cols;
  const float eps = 1e-5f;
  // Rows with an offset of 3: the mean's rounding matters (inputs in [1, 5]).
  const std::vector<float> xv = values(n, 61, dt, 1.0f, 5.0f), gv = values(n, 62, dt);
  std::vector<float> wv(c.cols, 1.0f), bv(c.cols, 0.0f);
  if (c.affine) {
    wv = values(c.cols, 63, wdt, 0.5f, 1.5f);
    bv = values(c.cols, 64, wdt, -1.0f, 1.0f);
  }
  const Tensor x = make(xv, Shape{c.rows, c.cols}, dt, dev), g = make(gv, x.shape(), dt, dev);
  const Tensor w = make(wv, Shape{c.cols}, wdt, dev), b = make(bv, Shape{c.cols}, wdt, dev);
  Tensor y = Tensor::empty(x.shape(), dt, dev), mean = Tensor::empty(Shape{c.rows}, DType::F32, dev);
  Tensor rstd = Tensor::empty(Shape{c.rows}, DType::F32, dev), dx = Tensor::empty(x.shape(), dt, dev);
  const Tensor* wp = c.affine ? &w : nullptr;
  be.layer_norm(x, wp, c.affine ? &b : nullptr, eps, y, mean, rstd);
  std::vector<double> yref(n), ymag(n), dref(n), dmag(n), wref(c.cols, 0.0), wmag(c.cols, 0.0), bref(c.cols, 0.0),
      bmag(c.cols, 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    const float* xr = &xv[r * c.cols];
    const float* gr = &gv[r * c.cols];
    double mu = 0.0, var = 0.0, abs_dev = 0.0;
    for (int64_t j = 0; j < c.cols; ++j) mu += xr[j];
    mu /= c.cols;
    for (int64_t j = 0; j < c.cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= c.cols;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < c.cols; ++j) abs_dev += std::fabs(xr[j] - mu);
    const double m_err = abs_dev / c.cols * rs + 1.0;
    double mg = 0.0, mgx = 0.0, mag_g = 0.0, mag_gx = 0.0;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double xh = (xr[j] - mu) * rs, gj = double(gr[j]) * wv[j];
      mg += gj;
      mgx += gj * xh;
      mag_g += std::fabs(gj);
      mag_gx += std::fabs(gj * xh);
    }
    mg /= c.cols, mgx /= c.cols, mag_g /= c.cols, mag_gx /= c.cols;
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t i = r * c.cols + j;
      const double xh = (xr[j] - mu) * rs, gj = double(gr[j]) * wv[j];
      yref[i] = xh * wv[j] + bv[j];
      ymag[i] = (std::fabs(xh) + m_err) * std::fabs(wv[j]) + std::fabs(bv[j]);
      dref[i] = rs * (gj - mg - xh * mgx);
      dmag[i] = rs * (std::fabs(gj) + (1.0 + std::fabs(xh) + m_err) * (mag_g + mag_gx));
      wref[j] += double(gr[j]) * xh;
      wmag[j] += std::fabs(gr[j]) * (std::fabs(xh) + m_err);
      bref[j] += gr[j];
      bmag[j] += std::fabs(gr[j]);
    }
  }
  check_close(host(y), yref, tolerance_for(dt, dt, c.cols + 8), ymag);
  // dweight and dbias added onto 0.5 (accumulate), as gradients accumulate across micro-batches.
  Tensor dw = make(std::vector<float>(c.cols, 0.5f), Shape{c.cols}, DType::F32, dev);
  Tensor db = make(std::vector<float>(c.cols, 0.5f), Shape{c.cols}, DType::F32, dev);
  be.layer_norm_backward(x, wp, mean, rstd, g, dx, &dw, &db, true);
  check_close(host(dx), dref, tolerance_for(dt, dt, 2 * c.cols + 8), dmag);
  for (int64_t j = 0; j < c.cols; ++j) {
    wref[j] += 0.5, wmag[j] += 0.5, bref[j] += 0.5, bmag[j] += 0.5;
  }
  check_close(host(dw), wref, tolerance_for(dt, DType::F32, c.rows + c.cols + 8), wmag);
  check_close(host(db), bref, tolerance_for(dt, DType::F32, c.rows + 1), bmag);
}

// Rows of 37 (not a multiple of the 16 lanes), of 300, and of 1 (variance 0: y = bias).
inline void check_layer_norm(Device dev) {
  for (const NormCase& c : {NormCase{7, 37, true}, NormCase{3, 300, true}, NormCase{6, 16, false}, NormCase{5, 1, true}})
    for (DType dt : kMathDtypes) check_layer_norm_case(dev, c, dt, DType::F32);
  // Weights in a low dtype too (an FP16 working copy of the parameters).
  for (DType dt : {DType::F16, DType::BF16}) check_layer_norm_case(dev, NormCase{4, 45, true}, dt, dt);
}

}  // namespace belay::test::transformer
