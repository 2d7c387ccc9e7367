// loss: the fused cross-entropy alone (the backend's cross_entropy: the mean loss and the unit
// gradient (softmax - onehot) / B in one call), FP32 logits [B*T, V], at the default GPT's
// shape with a larger batch ([4096, 256]) and at GPT-2's vocabulary padded to a multiple of 64
// ([1024, 50304]; quick: [256, 50304]), on the active CPU ISA path and the threads OpenMP gives
// (run under OMP_NUM_THREADS=1 and 2 for the thread scaling). Reported as ms, ns per logit and
// GB/s with the bytes counted once: the logits read, the gradient written (8 bytes a logit).
//
// Check (after timing): the loss against FP64 from the logits as stored (1e-5 relative), and 4
// sampled rows of the gradient against FP64, within 64 FP32 ulps of the row's largest
// (p + onehot) / B: a fast wrong kernel cannot report.
#include <algorithm>
#include <cmath>

#include "bench/sections.h"
#include "engine/backend.h"

namespace belay::bench {
namespace {

struct LossCase {
  int64_t rows, classes;
};

Json loss_row(const LossCase& c, int reps) {
  Rng rng(2026);
  std::vector<float> xv(static_cast<size_t>(c.rows * c.classes)), lab(static_cast<size_t>(c.rows));
  for (float& v : xv) v = rng.uniform(-4.0f, 4.0f);
  for (float& l : lab) l = static_cast<float>(rng.next_u64() % static_cast<uint64_t>(c.classes));
  const Tensor logits = Tensor::from_vector(xv, Shape{c.rows, c.classes});
  const Tensor labels = Tensor::from_vector(lab, Shape{c.rows});
  Tensor loss = Tensor::empty(Shape{1}), grad = Tensor::empty(Shape{c.rows, c.classes});
  const Backend& be = backend_for(Device::cpu());
  const Timing t = time_it(1, reps, [&] { be.cross_entropy(logits, labels, loss, grad); });

  const std::string what = "cross_entropy [" + std::to_string(c.rows) + ", " + std::to_string(c.classes) + "]";
  const float* g = grad.data_as<float>();
  double total = 0.0;
  for (int64_t r = 0; r < c.rows; ++r) {
    const float* x = xv.data() + r * c.classes;
    double mx = -INFINITY, z = 0.0;
    for (int64_t j = 0; j < c.classes; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    for (int64_t j = 0; j < c.classes; ++j) z += std::exp(x[j] - mx);
    const double lse = mx + std::log(z);
    const int64_t label = static_cast<int64_t>(lab[r]);
    total += lse - x[label];
    if (r != 0 && r != c.rows / 3 && r != c.rows / 2 + 1 && r != c.rows - 1) continue;
    for (int64_t j = 0; j < c.classes; ++j) {
      const double p = std::exp(x[j] - lse), onehot = j == label ? 1.0 : 0.0;
      const double want = (p - onehot) / c.rows, bound = 64.0 * 0x1p-24 * (p + onehot) / c.rows;
      require(std::fabs(g[r * c.classes + j] - want) <= bound,
              what + ": gradient [" + std::to_string(r) + ", " + std::to_string(j) + "] = " +
                  std::to_string(g[r * c.classes + j]) + ", fp64 " + std::to_string(want));
    }
  }
  const double want_loss = total / c.rows;
  require(std::fabs(loss.item() - want_loss) <= 1e-5 * std::fabs(want_loss),
          what + ": loss " + std::to_string(loss.item()) + ", fp64 " + std::to_string(want_loss));

  const double n = static_cast<double>(c.rows * c.classes);
  return Json{{"rows", c.rows},
              {"classes", c.classes},
              {"dtype", "fp32"},
              {"time", to_json(t)},
              {"ns_per_logit", t.median_ms * 1e6 / n},
              {"gb_per_s", 8.0 * n / (t.median_ms * 1e-3) * 1e-9}};
}

}  // namespace

Json bench_loss(const Options& o) {
  const std::vector<LossCase> cases =
      o.quick ? std::vector<LossCase>{{4096, 256}, {256, 50304}} : std::vector<LossCase>{{4096, 256}, {1024, 50304}};
  Json rows = Json::array();
  for (const LossCase& c : cases) rows.push_back(loss_row(c, o.quick ? 3 : 7));
  return Json{{"threads", max_threads()}, {"cross_entropy", rows}};
}

}  // namespace belay::bench
