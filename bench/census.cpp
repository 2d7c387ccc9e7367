// The guard with and without the census (engine/census.h), per CPU ISA path: the same one read
// of every gradient (4 or 2 bytes per element) and no more memory traffic. Gradients of 32M
// elements (128 MB FP32, past any cache), as FP32 and FP16 buffers, of two kinds:
// - "plain": magnitudes 2^-11 to 2^10 (normal in FP16), an exact zero every 1021 values: the
//   census's fast steps (the min and max of 64 values' magnitudes, 3 operations per 8 values,
//   fewer in the wider scans) carry 15 of every 16 steps, the others are classified in full;
// - "flagged": magnitudes 2^-30 to 2^10, so every step holds a value below FP16's normal range
//   and every value is classified (the dense loop: on avx512 8 more operations per 16 FP32
//   values or 6 per 32 FP16 values, on avx2 per 8 and 16), and one inf, so the call that
//   holds it is counted twice: the census's worst case.
// The target: at most 10% over the plain guard's time. The two are timed alternately (15
// pairs): drift on a shared machine (its memory bandwidth moved by 10% within an hour) then
// moves both alike, and runs back to back agree within 0.01-0.03 on each ratio.
//
// And a model's gradients, small ones (the default GPT's 36 parameters, 437,760 values, FP32:
// the guard's batches of chunks from several gradients, kernels/cpu/guard_kernels.cpp), each
// sample 20 calls, of three kinds: "plain" (magnitudes 2^-10 to 2^10), "sparse" (one value in
// 5000 a subnormal of FP16's, as a sound loss scale leaves a few) and "thick" (one in 100:
// every block of every gradient holds some, as a scale far too low leaves them).
//
// Checks: the census run's found_inf and norm are the plain run's bits, and its counts add up
// to what was planted (the infs, the exact zeros the data holds, the subnormals), so a census
// that skipped its work cannot report.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/gpt.h"
#include "bench/sections.h"
#include "engine/backend.h"
#include "engine/census.h"
#include "kernels/cpu/cpu_isa.h"

namespace belay::bench {

namespace {

// n gradient values of the kind above (plain or flagged), as FP32.
std::vector<float> census_bench_values(int64_t n, bool flagged) {
  Rng rng(42);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v)
    if (flagged) {
      x = std::ldexp(rng.uniform() - 0.5f, static_cast<int>(rng.uniform() * 40.0f) - 30);
    } else {
      const float m = std::ldexp(0.5f + 0.5f * rng.uniform(), static_cast<int>(rng.uniform() * 20.0f) - 10);
      x = rng.uniform() < 0.5f ? -m : m;
    }
  for (int64_t i = 0; i < n; i += 1021) v[static_cast<size_t>(i)] = 0.0f;
  if (flagged) v[static_cast<size_t>(n / 3)] = INFINITY;
  return v;
}

// The default GPT's gradients as FP32 tensors of the given kind, and how many subnormals of
// FP16 were planted.
std::vector<Tensor> model_gradients(const std::string& kind, int64_t* planted) {
  Rng init(1), rng(42);
  const Gpt model{GptConfig{}, init};
  const int64_t every = kind == "sparse" ? 5000 : kind == "thick" ? 100 : 0;
  std::vector<Tensor> grads;
  int64_t at = 0;
  *planted = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    std::vector<float> v(static_cast<size_t>(p.value().numel()));
    for (float& x : v) {
      const float m = std::ldexp(0.5f + 0.5f * rng.uniform(), static_cast<int>(rng.uniform() * 20.0f) - 10);
      x = rng.uniform() < 0.5f ? -m : m;
      if (every > 0 && ++at % every == 0) x = 1e-6f, ++*planted;  // FP16's subnormals: 2^-24 to 2^-14
    }
    grads.push_back(Tensor::from_vector(v, p.value().shape()));
  }
  return grads;
}

// The model rows: the guard with and without the census on every path, 20 calls a sample.
void bench_model_census(const Options& o, Json& out) {
  const Backend& be = backend_for(Device::cpu());
  const Tensor inv = Tensor::scalar(1.0f / 1024.0f);
  Tensor found = Tensor::empty(Shape{1}), norm = Tensor::empty(Shape{1});
  Tensor found_c = Tensor::empty(Shape{1}), norm_c = Tensor::empty(Shape{1});
  for (const std::string kind : {"plain", "sparse", "thick"}) {
    int64_t planted = 0;
    const std::vector<Tensor> grads = model_gradients(kind, &planted);
    std::vector<const Tensor*> g;
    for (const Tensor& t : grads) g.push_back(&t);
    Tensor census = Tensor::empty(Shape{static_cast<int64_t>(g.size()), kCensusFields});
    for (const CpuIsa isa : kAllCpuIsas) {
      if (!cpu_isa_available(isa) || (isa != CpuIsa::Baseline && isa != CpuIsa::Avx2 && isa != CpuIsa::Avx512))
        continue;
      force_cpu_isa(isa);
      constexpr int kCalls = 20;
      const auto [plain, with] = time_pair(
          1, o.quick ? 5 : 15, [&] { for (int i = 0; i < kCalls; ++i) be.guard(g, inv, found, norm); },
          [&] { for (int i = 0; i < kCalls; ++i) be.guard(g, inv, found_c, norm_c, GuardCensus{&census, DType::F16}); });
      require(std::memcmp(found.data(), found_c.data(), 4) == 0 && std::memcmp(norm.data(), norm_c.data(), 4) == 0,
              "census: the guard's outputs changed with the census (model gradients)");
      const uint32_t* w = census.data_as<const uint32_t>();
      int64_t subnormals = 0;
      for (size_t t = 0; t < g.size(); ++t) subnormals += w[t * kCensusFields + kCensusSubnormal];
      require(subnormals == planted, "census: " + std::to_string(subnormals) + " subnormals counted in the model's "
                                         "gradients; planted " + std::to_string(planted));
      out["gpt_" + kind + "_fp32_" + cpu_isa_name(isa)] =
          Json{{"tensors", static_cast<int64_t>(g.size())},
               {"guard", to_json(plain)},
               {"guard_with_census", to_json(with)},
               {"calls_per_sample", kCalls},
               {"census_over_guard", with.median_ms / plain.median_ms},
               {"target", "census_over_guard <= 1.10"}};
    }
  }
}

}  // namespace

Json bench_census(const Options& o) {
  const int64_t n = o.quick ? (int64_t{1} << 23) : (int64_t{1} << 25);
  const int reps = o.quick ? 5 : 15;
  const Backend& be = backend_for(Device::cpu());
  const CpuIsa saved = active_cpu_isa();
  Json out = Json::object();
  for (const bool flagged : {false, true})
  for (const DType dtype : {DType::F32, DType::F16}) {
    const Tensor g = Tensor::from_vector(census_bench_values(n, flagged), Shape{n}).to(dtype);
    const Tensor inv = Tensor::scalar(1.0f / 1024.0f);
    Tensor found = Tensor::empty(Shape{1}), norm = Tensor::empty(Shape{1});
    Tensor found_c = Tensor::empty(Shape{1}), norm_c = Tensor::empty(Shape{1});
    Tensor census = Tensor::empty(Shape{1, kCensusFields});
    int64_t zeros = 0;
    for (float x : g.to_vector()) zeros += x == 0.0f ? 1 : 0;
    for (const CpuIsa isa : kAllCpuIsas) {
      if (!cpu_isa_available(isa) || (isa != CpuIsa::Baseline && isa != CpuIsa::Avx2 && isa != CpuIsa::Avx512))
        continue;  // the wider paths run the avx512 element kernels
      force_cpu_isa(isa);
      // Alternately, so that drift on a shared machine moves both alike.
      const auto [plain, with] =
          time_pair(1, reps, [&] { be.guard({&g}, inv, found, norm); },
                    [&] { be.guard({&g}, inv, found_c, norm_c, GuardCensus{&census, DType::F16}); });
      require(std::memcmp(found.data(), found_c.data(), 4) == 0 && std::memcmp(norm.data(), norm_c.data(), 4) == 0,
              "census: the guard's outputs changed with the census");
      const uint32_t* w = census.data_as<const uint32_t>();
      const uint32_t infs = flagged ? 1 : 0;
      require(w[kCensusNonfinite] == infs && w[kCensusZeros] == static_cast<uint32_t>(zeros),
              "census: counts " + std::to_string(w[kCensusNonfinite]) + " non-finite, " +
                  std::to_string(w[kCensusZeros]) + " zeros; planted " + std::to_string(infs) + " and " +
                  std::to_string(zeros));
      const double gbs = static_cast<double>(n) * static_cast<double>(dtype_size(dtype)) / (plain.median_ms * 1e6);
      out[std::string(flagged ? "flagged_" : "plain_") + dtype_name(dtype) + "_" + cpu_isa_name(isa)] =
          Json{{"elements", n},
               {"guard", to_json(plain)},
               {"guard_with_census", to_json(with)},
               {"guard_gb_per_s", gbs},
               {"census_over_guard", with.median_ms / plain.median_ms},
               {"target", "census_over_guard <= 1.10"}};
    }
  }
  bench_model_census(o, out);
  force_cpu_isa(saved);
  return out;
}

}  // namespace belay::bench
