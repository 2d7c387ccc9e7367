// 1 thread vs 2 threads (omp_set_num_threads), the same work each way: copy bandwidth,
// the fused AMP step on 16M parameters, an fp32 and a bf16 gemm (Linear(1024) forward at
// batch 256), and a whole Linear(4096) training step. Results are checked by the sections
// these reuse; here only the speedup matters.
#include <omp.h>

#include "bench/sections.h"
#include "engine/backend.h"
#include "engine/random.h"

namespace belay::bench {

namespace {

double fused_amp_ms(int64_t n, int reps) {
  const Backend& be = backend_for(Device::cpu());
  Tensor p = Tensor::full(Shape{n}, 0.01f), m = Tensor::zeros(Shape{n}), v = Tensor::zeros(Shape{n});
  Tensor g = Tensor::full(Shape{n}, 3.0f), w = Tensor::zeros(Shape{n}, DType::F16);
  const Tensor inv = Tensor::scalar(1.0f / 65536.0f);
  Tensor found = Tensor::scalar(0.0f), norm = Tensor::scalar(0.0f);
  Tensor coef = Tensor::scalar(0.0f);
  const AdamWHyper h;
  const Tensor lr = Tensor::scalar(1e-3f), applied = Tensor::scalar(0.0f);
  const std::vector<AdamWSlot> slots{{&p, &m, &v, &g, &w, 0.01f}};
  const Timing t = time_it(2, reps, [&] {
    be.guard({&g}, inv, found, norm);
    be.clip_coefficient(norm, 1.0f, coef);
    be.adamw(h, slots, StepScalars{&inv, &coef, &found, &lr, &applied});
  });
  const double expect = static_cast<double>(n) * (3.0 / 65536.0) * (3.0 / 65536.0);
  require(std::fabs(norm.item() - std::sqrt(expect)) <= 1e-5 * std::sqrt(expect), "threads: guard norm");
  return t.median_ms;
}

double gemm_ms(DType dt, int reps) {
  const int64_t b = 256, n = 1024;
  Rng rng(3);
  Tensor x = Tensor::empty(Shape{b, n}), w = Tensor::empty(Shape{n, n});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = rng.uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = rng.uniform(-0.03f, 0.03f);
  const Tensor xd = x.to(dt), wd = w.to(dt);
  Tensor y = Tensor::empty(Shape{b, n}, dt);
  GemmArgs a{&xd, false, &wd, true, &y, 0.0f, nullptr};
  return time_it(2, reps, [&] { backend_for(Device::cpu()).gemm(a); }).median_ms;
}

}  // namespace

Json bench_threads(const Options& o) {
  const int saved = omp_get_max_threads();
  Json by_threads = Json::object();
  for (const int t : {1, 2}) {
    omp_set_num_threads(t);
    Json r;
    r["copy_gb_per_s"] = stream_copy_gbs((o.quick ? 64ull : 256ull) << 20, o.quick ? 3 : 5);
    r["fused_amp_16m_ms"] = fused_amp_ms(o.quick ? (1 << 22) : (16 << 20), o.quick ? 3 : 8);
    r["gemm1024_fp32_ms"] = gemm_ms(DType::F32, o.quick ? 3 : 10);
    r["gemm1024_bf16_ms"] = gemm_ms(DType::BF16, o.quick ? 3 : 10);
    const TrainModel lin = o.quick ? TrainModel{"linear1024", 1024, 0, 1024, 1} : TrainModel{"linear4096", 4096, 0, 4096, 1};
    r["train_linear_fp32_ms"] = train_pair(lin, DType::F32, 1, 3).second["time"]["median_ms"];
    by_threads[std::to_string(t)] = r;
  }
  omp_set_num_threads(saved);
  Json speedup;
  for (auto& [k, v] : by_threads["1"].items()) {
    const double one = v.get<double>(), two = by_threads["2"][k].get<double>();
    speedup[k] = k == "copy_gb_per_s" ? two / one : one / two;  // >1: two threads are faster
  }
  return Json{{"threads", by_threads}, {"speedup_2_over_1", speedup}};
}

}  // namespace belay::bench
