// CUDA reductions and losses against FP64 references, through the one tolerance helper;
// plus run-to-run determinism (fixed-order sums, no atomics).
#include <algorithm>
#include <utility>
#include <cmath>

#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {
const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

// sum_rows of x [rows, cols] against FP64 column sums, then accumulated onto its own result
// (twice the sums). Returns the first result, for the repeatability checks.
std::vector<float> check_sum_rows(const Pair& x, DType d) {
  const int64_t rows = x.host.dim(0), cols = x.host.dim(1);
  const std::vector<float> xv = x.host.to_vector();
  std::vector<double> col_sum(static_cast<size_t>(cols), 0.0), col_mag(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      col_sum[c] += xv[r * cols + c];
      col_mag[c] += std::fabs(xv[r * cols + c]);
    }
  Tensor out = Tensor::full(Shape{cols}, 1.0f, DType::F32, Device::cuda());
  gpu().sum_rows(x.device, out, false);
  const std::vector<float> first = out.to_vector();
  check_close(first, col_sum, tolerance_for(d, DType::F32, rows), col_mag);
  gpu().sum_rows(x.device, out, true);  // accumulate: twice the sum
  for (size_t c = 0; c < col_sum.size(); ++c) {
    col_sum[c] *= 2.0;
    col_mag[c] *= 2.0;
  }
  check_close(out.to_vector(), col_sum, tolerance_for(d, DType::F32, rows + 1), col_mag);
  return first;
}
}  // namespace

TEST_CASE("cuda sum and sum_rows match FP64 and repeat bit for bit", "[gpu][reduce]") {
  BELAY_REQUIRE_GPU();
  for (int64_t rows : odd_sizes())
    for (int64_t cols : odd_sizes())
      for (DType d : kDtypes) {
        Pair x = make_pair(Shape{rows, cols}, d, 21 + rows * 7 + cols);
        const std::vector<float> xv = x.host.to_vector();
        INFO(name_of(d) << " [" << rows << ", " << cols << "]");

        Tensor s = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
        gpu().sum(x.device, s);
        double total = 0.0, mag = 0.0;
        for (float v : xv) {
          total += v;
          mag += std::fabs(v);
        }
        check_close({s.item()}, {total}, tolerance_for(d, DType::F32, rows * cols), {mag});
        Tensor s2 = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
        gpu().sum(x.device, s2);
        CHECK(f32_bits(s.item()) == f32_bits(s2.item()));

        check_sum_rows(x, d);
      }
}

TEST_CASE("cuda sum_rows over many rows (split into row ranges) matches FP64 and repeats bit for bit",
          "[gpu][reduce]") {
  BELAY_REQUIRE_GPU();
  // Tall and narrow, as a bias gradient over a large batch is: the first three shapes split
  // the rows into 97, 4 and 2 ranges whose partials a second kernel adds; the last is just
  // over the threshold and stays one range.
  const std::pair<int64_t, int64_t> shapes[] = {{100000, 7}, {5000, 1000}, {3000, 129}, {1025, 1}};
  for (auto [rows, cols] : shapes)
    for (DType d : kDtypes) {
      Pair x = make_pair(Shape{rows, cols}, d, 31 + rows + cols);
      INFO(name_of(d) << " [" << rows << ", " << cols << "]");
      const std::vector<float> first = check_sum_rows(x, d), again = check_sum_rows(x, d);
      for (size_t c = 0; c < first.size(); ++c) CHECK(f32_bits(first[c]) == f32_bits(again[c]));
    }
}

TEST_CASE("cuda mse forward and backward match FP64", "[gpu][reduce]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes) {
      Pair p = make_pair(Shape{n}, d, 31 + n), t = make_pair(Shape{n}, d, 32 + n);
      const std::vector<float> pv = p.host.to_vector(), tv = t.host.to_vector();
      double sq = 0.0;
      for (size_t i = 0; i < pv.size(); ++i) sq += ((double)pv[i] - tv[i]) * ((double)pv[i] - tv[i]);
      const double mse = sq / static_cast<double>(n);
      INFO(name_of(d) << ", n = " << n);
      Tensor out = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
      gpu().mse_forward(p.device, t.device, out);
      check_close({out.item()}, {mse}, tolerance_for(d, DType::F32, n));  // all terms >= 0: magnitude = result

      Tensor g = Tensor::scalar(0.75f, DType::F32, Device::cuda());
      Tensor dp = Tensor::empty(Shape{n}, d, Device::cuda());
      gpu().mse_backward(p.device, t.device, g, dp);
      std::vector<double> want(pv.size());
      for (size_t i = 0; i < pv.size(); ++i) want[i] = 2.0 * 0.75 * ((double)pv[i] - tv[i]) / static_cast<double>(n);
      // FP32: 2*g, /n, p - t, the product: four roundings.
      check_close(dp.to_vector(), want, tolerance_for(d, d, 4));
    }
}

TEST_CASE("cuda cross_entropy matches FP64 loss and gradient", "[gpu][reduce]") {
  BELAY_REQUIRE_GPU();
  for (int64_t rows : odd_sizes())
    for (int64_t classes : odd_sizes())
      for (DType d : kDtypes) {
        // Wide logits: the row maximum must be subtracted or exp overflows.
        Pair logits = make_pair(Shape{rows, classes}, d, 41 + rows + classes, -60.0f, 60.0f);
        std::vector<float> lab(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) lab[r] = static_cast<float>((r * 7919) % classes);
        Tensor labels = Tensor::from_vector(lab, Shape{rows}, DType::F32, Device::cuda());
        const std::vector<float> xv = logits.host.to_vector();
        double loss = 0.0, loss_mag = 0.0;
        std::vector<double> grad(xv.size()), grad_mag(xv.size());
        for (int64_t r = 0; r < rows; ++r) {
          double mx = -INFINITY;
          for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, (double)xv[r * classes + c]);
          double z = 0.0;
          for (int64_t c = 0; c < classes; ++c) z += std::exp(xv[r * classes + c] - mx);
          const double log_z = std::log(z) + mx;
          const int64_t label = static_cast<int64_t>(lab[r]);
          loss += log_z - xv[r * classes + label];
          loss_mag += std::fabs(log_z) + std::fabs(xv[r * classes + label]);
          for (int64_t c = 0; c < classes; ++c) {
            const double pr = std::exp(xv[r * classes + c] - log_z);
            grad[r * classes + c] = (pr - (c == label ? 1.0 : 0.0)) / rows;
            grad_mag[r * classes + c] = (pr + (c == label ? 1.0 : 0.0)) / rows;
          }
        }
        INFO(name_of(d) << " [" << rows << ", " << classes << "]");
        Tensor lg = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
        Tensor dg = Tensor::empty(Shape{rows, classes}, DType::F32, Device::cuda());
        gpu().cross_entropy(logits.device, labels, lg, dg);
        check_close({lg.item()}, {loss / rows}, tolerance_for(d, DType::F32, rows + classes), {loss_mag / rows});
        check_close(dg.to_vector(), grad, tolerance_for(d, DType::F32, classes), grad_mag);
      }
}

TEST_CASE("cuda cross_entropy turns an invalid label into a NaN loss instead of a host check", "[gpu][reduce]") {
  BELAY_REQUIRE_GPU();
  Pair logits = make_pair(Shape{7, 5}, DType::F32, 51);
  Tensor labels = Tensor::from_vector({0, 1, 2, 5, 4, 3, 2}, Shape{7}, DType::F32, Device::cuda());  // 5: out of range
  Tensor loss = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
  Tensor dl = Tensor::empty(Shape{7, 5}, DType::F32, Device::cuda());
  gpu().cross_entropy(logits.device, labels, loss, dl);
  CHECK(std::isnan(loss.item()));
}
