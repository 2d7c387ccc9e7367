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
// Checks: the census run's found_inf and norm are the plain run's bits, and its counts add up
// to what was planted (the infs, the exact zeros the data holds), so a census that skipped
// its work cannot report.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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
  force_cpu_isa(saved);
  return out;
}

}  // namespace belay::bench
