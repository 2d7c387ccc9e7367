// Per CPU ISA path (kernels/cpu/cpu_isa.h), in one run: the FMA peak of the machine on all
// threads (bench/fma_peak.cpp, a copy per path) and the fp32 GEMM of the three Linear(4096)
// products at batch 256 through that path (belay's gemm forced onto it), as GFLOP/s and as a
// fraction of the same path's peak and of the widest path's peak (the machine's limit).
// 4096 also under --quick: it is the target shape, and a few seconds per path.
// Also per path: GELU forward + backward on 1M FP32 elements on one thread (the element
// kernels, kernels/cpu/isa/erf_exp.h), beside the scalar loop over glibc's erff/expf that
// the CPU backend ran before (kernels/common/element_math.h, still the CUDA kernels' code).
//
// Checks: every lane of the peak loop ends at exactly 1 (x = 0.75 x + 0.25 from 1), so a
// loop the compiler removed or cut short cannot report; the GEMMs as in bench/gemm.cpp.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench/fma_peak.h"
#include "bench/sections.h"
#include "engine/backend.h"
#include "engine/random.h"
#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_convert.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::bench {

PeakRun run_peak(CpuIsa isa, int64_t iters) {
  switch (isa) {
    case CpuIsa::Baseline: return isa_baseline::fma_peak(iters, 0.75f, 0.25f, 1.0f);
    case CpuIsa::Avx2: return isa_avx2::fma_peak(iters, 0.75f, 0.25f, 1.0f);
    case CpuIsa::Avx512:
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Amx: return isa_avx512::fma_peak(iters, 0.75f, 0.25f, 1.0f);  // the same FP32 FMAs
  }
  return {};
}

// Checks a peak loop's lanes (each ends at exactly 1) and returns its GFLOP/s.
double peak_gflops(const std::string& what, const Timing& t, const PeakRun& run) {
  require(run.sum == static_cast<double>(run.lanes_total), what + ": lanes sum to " + std::to_string(run.sum) +
                                                               ", expected " + std::to_string(run.lanes_total));
  return run.flops / (t.median_ms * 1e6);
}

Bf16Limit bf16_limit(CpuIsa isa, int reps, double fp32_peak) {
  PeakRun run;
  if (isa == CpuIsa::Avx512Bf16) {
    const Timing t = time_it(1, reps, [&] { run = isa_avx512bf16::fma_peak(50'000'000, 1.0f, 0.25f, 1.0f); });
    return {"dot_peak", to_json(t), peak_gflops("vdpbf16ps peak", t, run)};
  }
  if (isa == CpuIsa::Amx) {
    // 500000 iterations <= 2^19: every element stays an exact integer (tile_peak.cpp).
    const Timing t = time_it(1, reps, [&] { run = isa_amx::tile_peak(500'000); });
    return {"tile_peak", to_json(t), peak_gflops("tdpbf16ps peak", t, run)};
  }
  return {"peak", Json(), fp32_peak};
}

namespace {

// GELU inputs and a random dy, of two kinds: "wide", uniform over (-5, 5), where erf is
// neither +-1 nor linear (three in four values take erf's long polynomial, |x| > 1.24); and
// "normal", N(0, 1) as a pre-activation after LayerNorm (one in five takes it).
struct GeluData {
  static constexpr int64_t n = 1 << 20;
  std::vector<float> x, dy, y, dx;
  explicit GeluData(bool normal) : x(n), dy(n), y(n), dx(n) {
    Rng rng(1 << 20);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = normal ? rng.normal() : rng.uniform(-5.0f, 5.0f);
      dy[i] = rng.uniform(-1.0f, 1.0f);
    }
  }
  // Forward then backward through fwd(x, y, n) and bwd(x, dy, dx, n); then a check of a few
  // elements against FP64 (the bound of tests/kernels/test_cpu_isa.cpp, loosely: 1e-6 of
  // |x| or of 1 + |x| pdf), so a loop that computed nothing cannot report.
  Json time(const std::string& what, int reps, const std::function<void()>& fwd_bwd) {
    const Timing t = time_it(1, reps, fwd_bwd);
    for (int64_t i = 0; i < n; i += 4099) {
      const double v = x[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0)), pdf = std::exp(-0.5 * v * v) / 2.5066282746310002;
      require(std::fabs(y[i] - v * cdf) <= 1e-6 * (std::fabs(v) + 1e-30) &&
                  std::fabs(dx[i] - dy[i] * (cdf + v * pdf)) <= 1e-6 * (1.0 + std::fabs(v) * pdf),
              what + ": GELU off at x = " + std::to_string(v));
    }
    return Json{{"time", to_json(t)}, {"ns_per_element", t.median_ms * 1e6 / static_cast<double>(n)}};
  }
  // Forward then backward on `isa`'s element kernels.
  Json time_path(CpuIsa isa, const std::string& what, int reps) {
    const ElementBlocks& blocks = cpu_element_blocks(isa);
    return time(what + cpu_isa_name(isa), reps, [&] {
      blocks.gelu(x.data(), y.data(), n);
      blocks.gelu_grad(x.data(), dy.data(), dx.data(), n);
    });
  }
};

}  // namespace

Json bench_isa(const Options& o) {
  const int64_t batch = 256, n = 4096;
  const int reps = o.quick ? 3 : 5;
  const int64_t iters = 50'000'000;
  const double flops = 2.0 * static_cast<double>(batch) * n * n;
  Rng rng(4096);
  const Tensor x = random_matrix(batch, n, 1.0f, rng), w = random_matrix(n, n, 1.0f / std::sqrt((float)n), rng);
  const Tensor dy = random_matrix(batch, n, 1e-2f, rng), bias = random_matrix(1, n, 0.1f, rng).reshape(Shape{n});
  Tensor y = Tensor::empty(Shape{batch, n}), dx = Tensor::empty(Shape{batch, n}), dw = Tensor::empty(Shape{n, n});
  const GemmArgs ops[3] = {{&x, false, &w, true, &y, 0.0f, &bias},
                           {&dy, false, &w, false, &dx, 0.0f, nullptr},
                           {&dy, true, &x, false, &dw, 0.0f, nullptr}};
  const char* names[3] = {"forward", "dX", "dW"};
  const Tensor x16 = x.to(DType::BF16), w16 = w.to(DType::BF16), dy16 = dy.to(DType::BF16);
  const Tensor low[3][2] = {{x16, w16}, {dy16, w16}, {dy16, x16}};  // each product's inputs in BF16

  GeluData gd(false), gd_normal(true);
  const int gelu_reps = o.quick ? 5 : 11;
  const Json gelu_glibc = gd.time("gelu glibc", gelu_reps, [&] {
    for (int64_t i = 0; i < gd.n; ++i) gd.y[i] = gelu_f32(gd.x[i]);
    for (int64_t i = 0; i < gd.n; ++i) gd.dx[i] = gd.dy[i] * gelu_grad_f32(gd.x[i]);
  });

  Json paths = Json::array();
  double widest_peak = NAN;
  for (const CpuIsa isa : kAllCpuIsas) {
    Json p{{"isa", cpu_isa_name(isa)}, {"available", cpu_isa_available(isa)}};
    if (!cpu_isa_available(isa)) {
      p["missing"] = cpu_isa_missing(isa);
      paths.push_back(p);
      continue;
    }
    PeakRun run;
    const Timing tp = time_it(1, reps, [&] { run = run_peak(isa, iters); });
    const double peak = peak_gflops(std::string("fma peak ") + cpu_isa_name(isa), tp, run);
    p["peak"] = Json{{"time", to_json(tp)}, {"gflops", peak}, {"flops", run.flops}};
    widest_peak = peak;  // paths are in increasing width; the last available is the widest
    for (int i = 0; i < 3; ++i) {
      const Timing t = time_it(1, reps, [&] { cpu_gemm_on(isa, ops[i]); });
      const double g = flops / (t.median_ms * 1e6);
      p["gemm_fp32"][names[i]] = Json{{"time", to_json(t)}, {"gflops", g}, {"fraction_of_peak", g / peak}};
    }
    GemmArgs nobias = ops[0];
    nobias.bias = nullptr;
    cpu_gemm_on(isa, nobias);
    const std::string tag = std::string(" (") + cpu_isa_name(isa) + ")";
    check_product(x, false, w, true, y, "isa forward" + tag);
    check_product(dy, false, w, false, dx, "isa dX" + tag);
    check_product(dy, true, x, false, dw, "isa dW" + tag);
    // The same products on BF16 inputs (FP32 out): widened to FP32 while packing on every
    // path but avx512bf16, whose VDPBF16PS limit is its own loop (4 flops per lane), and
    // amx, whose TDPBF16PS limit is its tile loop.
    const Bf16Limit limit = belay::bench::bf16_limit(isa, reps, peak);
    const double bf16_limit = limit.gflops;
    if (!limit.time.is_null()) p[limit.key] = Json{{"time", limit.time}, {"gflops", bf16_limit}};
    for (int i = 0; i < 3; ++i) {
      GemmArgs op = ops[i];
      op.a = &low[i][0];
      op.b = &low[i][1];
      const Timing t = time_it(1, reps, [&] { cpu_gemm_on(isa, op); });
      const double g = flops / (t.median_ms * 1e6);
      p["gemm_bf16"][names[i]] = Json{{"time", to_json(t)}, {"gflops", g}, {"fraction_of_limit", g / bf16_limit},
                                      {"vs_own_fp32", g / p["gemm_fp32"][names[i]]["gflops"].get<double>()}};
      op.bias = nullptr;  // checked like the FP32 ones: the product alone
      cpu_gemm_on(isa, op);
      check_product(low[i][0], op.trans_a, low[i][1], op.trans_b, *op.c, std::string("isa bf16 ") + names[i] + tag);
    }
    p["gelu_1m"] = gd.time_path(isa, "gelu ", gelu_reps);
    p["gelu_1m"]["vs_glibc"] = gelu_glibc["time"]["median_ms"].get<double>() / p["gelu_1m"]["time"]["median_ms"].get<double>();
    p["gelu_1m_normal"] = gd_normal.time_path(isa, "gelu normal ", gelu_reps);
    paths.push_back(p);
  }
  for (Json& p : paths)
    if (p["available"].get<bool>())
      for (const char* op : names)
        p["gemm_fp32"][op]["fraction_of_widest_peak"] = p["gemm_fp32"][op]["gflops"].get<double>() / widest_peak;
  return Json{{"threads", max_threads()}, {"batch", batch}, {"n", n}, {"cpu_isa", cpu_isa_report()},
              {"paths", paths}, {"gelu_1m_glibc", gelu_glibc}};
}

}  // namespace belay::bench
