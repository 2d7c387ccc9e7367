// rows: LayerNorm and softmax, forward and backward, at a transformer's shape (8192 rows of
// 768; quick: 1024), in fp32 and bf16 (bf16 in and out, FP32 inside; LayerNorm's weight and
// bias FP32), on the active CPU ISA path (kernels/cpu/isa/element_blocks.cpp). They are
// memory-bound passes, so each is reported as GB/s and as a fraction of the copy bandwidth
// measured in the same section (stream_copy_gbs: 256 MiB arrays, beyond the caches).
// Bytes as STREAM counts them, the tensors read and written once: forward x in, y out (2 per
// element); backward two in, one out (LayerNorm: x, dy -> dx; softmax: y, dy -> dx; 3 per
// element); mean, rstd and the [768] parameters and their gradients are left out (< 0.3%).
// A 8192 x 768 fp32 tensor is 24 MiB, under the 32 MiB L3 of the Zen 3 machine: a pass may
// run partly from the cache, so the fraction can pass 1.
//
// Check (after timing): 4 sampled rows of every output against FP64 from the inputs as
// stored, within 64 eps of the output dtype times the row's largest reference value.
#include <algorithm>
#include <cmath>

#include "bench/sections.h"
#include "engine/backend.h"

namespace belay::bench {
namespace {

struct RowsData {
  int64_t rows, cols;
  DType dt;
  Tensor x, dy, w, b, y, dx, mean, rstd, dw, db;
};

RowsData make_rows(int64_t rows, int64_t cols, DType dt) {
  Rng rng(2025);
  std::vector<float> xv(static_cast<size_t>(rows * cols)), gv(xv.size()), wv(static_cast<size_t>(cols)), bv(wv.size());
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = rng.uniform(-4.0f, 4.0f), gv[i] = rng.uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = rng.uniform(0.5f, 1.5f), bv[i] = rng.uniform(-0.5f, 0.5f);
  const Shape s{rows, cols};
  return RowsData{rows, cols, dt, Tensor::from_vector(xv, s, dt), Tensor::from_vector(gv, s, dt),
                  Tensor::from_vector(wv, Shape{cols}), Tensor::from_vector(bv, Shape{cols}), Tensor::empty(s, dt),
                  Tensor::empty(s, dt), Tensor::empty(Shape{rows}), Tensor::empty(Shape{rows}),
                  Tensor::zeros(Shape{cols}), Tensor::zeros(Shape{cols})};
}

// got against ref for one row: |got - ref| <= 64 eps max |ref| over the row.
void check_row(const float* got, const std::vector<double>& ref, DType dt, const std::string& what) {
  const double eps = dt == DType::F32 ? 0x1p-24 : 0x1p-8;
  double mag = 1e-30;
  for (double r : ref) mag = std::max(mag, std::fabs(r));
  for (size_t j = 0; j < ref.size(); ++j)
    require(std::fabs(got[j] - ref[j]) <= 64.0 * eps * mag,
            what + ": element " + std::to_string(j) + " = " + std::to_string(got[j]) + ", fp64 " + std::to_string(ref[j]));
}

// The four outputs of 4 sampled rows against FP64 (the backward from the forward's stored y).
void check_rows(const RowsData& d, bool layer_norm) {
  const std::vector<float> x = d.x.to_vector(), g = d.dy.to_vector(), y = d.y.to_vector(), dx = d.dx.to_vector();
  const std::vector<float> w = d.w.to_vector(), b = d.b.to_vector();
  const int64_t n = d.cols;
  for (int64_t r : {int64_t{0}, d.rows / 3, d.rows / 2 + 1, d.rows - 1}) {
    const float *xr = &x[r * n], *gr = &g[r * n];
    std::vector<double> yref(n), dref(n);
    if (layer_norm) {
      double mu = 0.0, var = 0.0, mg = 0.0, mgx = 0.0;
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= n;
      for (int64_t j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      const double rs = 1.0 / std::sqrt(var / n + 1e-5);
      for (int64_t j = 0; j < n; ++j) {
        const double xh = (xr[j] - mu) * rs;
        yref[j] = xh * w[j] + b[j];
        mg += double(gr[j]) * w[j] / n;
        mgx += double(gr[j]) * w[j] * xh / n;
      }
      for (int64_t j = 0; j < n; ++j) dref[j] = rs * (double(gr[j]) * w[j] - mg - (xr[j] - mu) * rs * mgx);
    } else {
      double mx = -INFINITY, z = 0.0, s = 0.0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(xr[j]));
      for (int64_t j = 0; j < n; ++j) z += std::exp(xr[j] - mx);
      for (int64_t j = 0; j < n; ++j) yref[j] = std::exp(xr[j] - mx) / z, s += double(gr[j]) * y[r * n + j];
      for (int64_t j = 0; j < n; ++j) dref[j] = y[r * n + j] * (gr[j] - s);
    }
    const std::string what = std::string(layer_norm ? "layer_norm " : "softmax ") + dtype_name(d.dt) + " row " +
                             std::to_string(r);
    check_row(&y[r * n], yref, d.dt, what + " forward");
    check_row(&dx[r * n], dref, d.dt, what + " backward");
  }
}

Json row_json(const char* op, const char* pass, DType dt, const Timing& t, double bytes, double copy_gbs) {
  const double gbs = bytes / (t.median_ms * 1e6);
  return Json{{"op", op},       {"pass", pass},        {"dtype", dtype_name(dt)}, {"time", to_json(t)},
              {"bytes", bytes}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / copy_gbs}};
}

}  // namespace

Json bench_rows(const Options& o) {
  const Backend& be = backend_for(Device::cpu());
  const int64_t rows = o.quick ? 1024 : 8192, cols = 768;
  const int reps = o.quick ? 5 : 20, warm = 3;
  const double copy_gbs = stream_copy_gbs((o.quick ? 64ull : 256ull) << 20, o.quick ? 3 : 10);
  Json out = Json::array();
  for (DType dt : {DType::F32, DType::BF16}) {
    RowsData d = make_rows(rows, cols, dt);
    const double elems = static_cast<double>(rows * cols), es = static_cast<double>(dtype_size(dt));
    const Timing lf = time_it(warm, reps, [&] { be.layer_norm(d.x, &d.w, &d.b, 1e-5f, d.y, d.mean, d.rstd); });
    const Timing lb = time_it(warm, reps, [&] {
      be.layer_norm_backward(d.x, &d.w, d.mean, d.rstd, d.dy, d.dx, &d.dw, &d.db, false);
    });
    check_rows(d, true);
    out.push_back(row_json("layer_norm", "forward", dt, lf, 2 * elems * es, copy_gbs));
    out.push_back(row_json("layer_norm", "backward", dt, lb, 3 * elems * es, copy_gbs));
    const Timing sf = time_it(warm, reps, [&] { be.softmax(d.x, cols, false, false, d.y); });
    const Timing sb = time_it(warm, reps, [&] { be.softmax_backward(d.y, d.dy, cols, false, false, d.dx); });
    check_rows(d, false);
    out.push_back(row_json("softmax", "forward", dt, sf, 2 * elems * es, copy_gbs));
    out.push_back(row_json("softmax", "backward", dt, sb, 3 * elems * es, copy_gbs));
  }
  return Json{{"rows", rows}, {"cols", cols}, {"threads", max_threads()}, {"copy_gb_per_s", copy_gbs}, {"ops", out}};
}

}  // namespace belay::bench
