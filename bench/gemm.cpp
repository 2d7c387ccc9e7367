// GEMM: the three products of a linear layer Y = X W^T + b at batch B = 256 and width n
// (in = out = n): forward Y = X W^T (+ b), dX = dY W, dW = dY^T X. belay's CPU matmul (the
// backend's gemm, fp32 and bf16/fp16 with FP32 accumulation) against Eigen called directly
// on FP32 matrices with the same expression, compiled with the same flags (the active ISA
// path's Eigen product, kernels/cpu/isa/, called without belay's wrapper): the ratio is
// what belay's wrapper costs (dtype widening, scratch, rounding). 2*B*n*n flops each.
//
// Check: 16 sampled outputs of every product against an FP64 dot product of the operands
// as stored, within 2k*2^-24*sum|a*b| plus the output rounding.
//
// Then GPT-2 small's step shapes (`gpt2_small`): the three products of each of its linear
// layers (attention qkv 768 -> 2304, attention projection 768 -> 768, MLP 768 -> 3072 and
// 3072 -> 768, the tied head 768 -> 50304) at M = 1024 and 4096 tokens (--quick: 1024, no head),
// and the 4096 x 4096 x 4096 squares (a Linear(4096) at 4096 tokens; not under --quick),
// fp32 through the backend, each as GFLOP/s and as a fraction of the FMA peak loop of the
// active path measured in the same run on the same threads (bench/fma_peak.cpp) and, where the
// machine's clock drifts, against the peak loop timed alternately with the product
// (`fraction_of_peak_beside`); and in bf16
// as a bf16 step runs them (BF16 y and dX, FP32 dW), as a fraction of the path's BF16 limit
// (TDPBF16PS tiles on amx, VDPBF16PS on avx512bf16, else the FMA peak) and over the fp32
// product. The blocking the GEMM ran with (kernels/cpu/gemm_blocking.h) is recorded beside them,
// and, alternately with each product on the AVX-512 paths, the other micro-tile (`wide_tile`), and
// with each forward at 1024 tokens, the same product on 4 KiB pages (`pages`). Before them, the
// default GPT's products (`gpt_default`: width 128, small N and K).
#include <cmath>
#include <cstring>
#include <vector>

#include "bench/fma_peak.h"
#include "bench/sections.h"
#include "engine/backend.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/isa/gemm_f32.h"

namespace belay::bench {

Tensor random_matrix(int64_t r, int64_t c, float bound, Rng& rng) {
  Tensor t = Tensor::empty(Shape{r, c});
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < r * c; ++i) p[i] = rng.uniform(-bound, bound);
  return t;
}

// C = op(A) op(B); checks 16 sampled entries against FP64.
void check_product(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, const std::string& what) {
  const std::vector<float> av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();  // as stored
  const int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
  Rng rng(7);
  const float out_eps = c.dtype() == DType::F32 ? 0x1p-24f : c.dtype() == DType::BF16 ? 0x1p-8f : 0x1p-11f;
  for (int s = 0; s < 16; ++s) {
    const int64_t i = static_cast<int64_t>(rng.next_u64() % m), j = static_cast<int64_t>(rng.next_u64() % n);
    double ref = 0.0, mag = 0.0;
    for (int64_t p = 0; p < k; ++p) {
      const double x = av[ta ? p * a.dim(1) + i : i * a.dim(1) + p];
      const double y = bv[tb ? j * b.dim(1) + p : p * b.dim(1) + j];
      ref += x * y;
      mag += std::fabs(x * y);
    }
    const double got = cv[i * n + j];
    const double bound = 2.0 * k * 0x1p-24 * mag + out_eps * std::fabs(ref) + 1e-30;
    require(std::fabs(got - ref) <= bound, what + ": C[" + std::to_string(i) + "," + std::to_string(j) + "] = " +
                                               std::to_string(got) + ", fp64 reference " + std::to_string(ref));
  }
}

namespace {

constexpr const char* kProducts[3] = {"forward", "dX", "dW"};

// The active path's FP32 FMA peak loop on all threads, GFLOP/s (median of `reps`); every lane
// must end at exactly 1, or the loop did not run as written.
double fma_peak_gflops(CpuIsa isa, int reps) {
  const int64_t iters = 50'000'000;
  PeakRun run;
  const Timing t = time_it(1, reps, [&] { run = run_peak(isa, iters); });
  return peak_gflops("fma peak", t, run);
}

// The fraction of the FMA peak a product reaches, the peak timed beside it: the product and a
// short run of the peak loop alternately, `reps` times each (time_pair), so a machine whose
// clock moves during the run (the AMX Xeon's: its peak loop 150-176 GFLOP/s in one hour) moves
// both alike. The product's GFLOP/s over the peak loop's, both medians. Only for products of
// several ms (GPT-2 small's): after 20 ms of other work a 0.3 ms product took 1.3-1.7x its
// back-to-back time there (a scalar loop in between did the same, so it is the caches, not the
// FMA clock: most likely the hypervisor moving the thread), which would count against it.
double fraction_beside_peak(CpuIsa isa, const std::function<void()>& product, double flops, int reps) {
  const int64_t iters = 10'000'000;  // ~20-30 ms on one AVX-512 core
  PeakRun run;
  const auto [tp, tk] = time_pair(0, reps, product, [&] { run = run_peak(isa, iters); });
  return flops / (tp.median_ms * 1e6) / peak_gflops("fma peak beside a product", tk, run);
}

// GPT-2 small's linear layers: (name, in, out).
struct GptLinear {
  const char* name;
  int64_t in, out;
};
constexpr GptLinear kGpt2Small[] = {{"attn.qkv", 768, 2304},
                                    {"attn.proj", 768, 768},
                                    {"mlp.fc", 768, 3072},
                                    {"mlp.proj", 3072, 768},
                                    {"head", 768, 50304},
                                    {"square 4096", 4096, 4096}};  // at 4096 tokens: the 4096 squares

// The three products of a GPT-2 layer as a bf16 step runs them: BF16 inputs, BF16 y and dX,
// FP32 dW (the master's gradient); GFLOP/s, the fraction of the path's BF16 limit and the
// speed over the same product in FP32 (`fp32`: that row's entry).
Json gpt2_bf16_products(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw, double flops, int reps,
                        const Bf16Limit& limit, const Json& fp32, const char* name) {
  const Backend& be = backend_for(Device::cpu());
  const Tensor xb = x.to(DType::BF16), wb = w.to(DType::BF16), dyb = dy.to(DType::BF16);
  Tensor y = Tensor::empty(Shape{x.dim(0), w.dim(0)}, DType::BF16), dx = Tensor::empty(x.shape(), DType::BF16);
  const GemmArgs ops[3] = {{&xb, false, &wb, true, &y, 0.0f, nullptr},
                           {&dyb, false, &wb, false, &dx, 0.0f, nullptr},
                           {&dyb, true, &xb, false, &dw, 0.0f, nullptr}};
  Json out{{"limit", limit.key}, {"limit_gflops", limit.gflops}};
  for (int i = 0; i < 3; ++i) {
    const Timing t = time_it(1, reps, [&] { be.gemm(ops[i]); });
    const double g = flops / (t.median_ms * 1e6);
    out[kProducts[i]] = Json{{"time", to_json(t)}, {"gflops", g}, {"fraction_of_limit", g / limit.gflops},
                             {"vs_own_fp32", g / fp32[kProducts[i]]["gflops"].get<double>()}};
  }
  check_product(xb, false, wb, true, y, std::string("gpt2 bf16 forward ") + name);
  check_product(dyb, false, wb, false, dx, std::string("gpt2 bf16 dX ") + name);
  check_product(dyb, true, xb, false, dw, std::string("gpt2 bf16 dW ") + name);
  return out;
}

// The FP32 product C = op(A) op(B) on the values at a, b and c, laid out as the matrices
// `as_a` and `as_b` are (their data may be elsewhere: a copy in other memory).
GemmF32Args f32_product(const void* a, const Tensor& as_a, bool ta, const void* b, const Tensor& as_b, bool tb,
                        float* c) {
  GemmF32Args g;
  g.a = a;
  g.a_rows = as_a.dim(0);
  g.a_cols = as_a.dim(1);
  g.trans_a = ta;
  g.b = b;
  g.b_rows = as_b.dim(0);
  g.b_cols = as_b.dim(1);
  g.trans_b = tb;
  g.c = c;
  return g;
}

// An FP32 product of the backend's form on the packed path's micro-tile `tile` (the bench's
// own control: the backend leaves the tile to N).
void packed_on_tile(CpuIsa isa, const GemmArgs& op, GemmTile tile) {
  GemmF32Args g = f32_product(op.a->data(), *op.a, op.trans_a, op.b->data(), *op.b, op.trans_b, op.c->data_as<float>());
  g.tile = tile;
  cpu_gemm_packed_direct(isa, g);
}

// Where the product takes the wide tile (AVX-512 paths, N filling its panels), the path's own
// tile beside it, timed alternately: the wide tile's time over the narrow one's.
Json wide_over_narrow(CpuIsa isa, const GemmArgs& op, int64_t n, int warm, int reps) {
  if (!cpu_gemm_has_wide_tile(isa) || !gemm_prefers_wide_tile(n, kGemmWideNr)) return nullptr;
  const auto [wide, narrow] = time_pair(warm, reps, [&] { packed_on_tile(isa, op, GemmTile::Wide); },
                                        [&] { packed_on_tile(isa, op, GemmTile::Narrow); });
  return Json{{"wide_ms", wide.median_ms}, {"narrow_ms", narrow.median_ms}, {"ratio", wide.median_ms / narrow.median_ms}};
}

// The forward product of a layer (y = x w^T) on the backend's buffers (2 MiB pages where the
// kernel gives them: kernels/cpu/cpu_backend.cpp) and on copies in plain std::vector storage
// (4 KiB pages under THP's madvise mode), timed alternately: the huge pages' time over the
// small pages'.
Json huge_over_small_pages(CpuIsa isa, const Tensor& x, const Tensor& w, Tensor& y, int warm, int reps) {
  const std::vector<float> xs = x.to_vector(), ws = w.to_vector();
  std::vector<float> ys(static_cast<size_t>(y.numel()));
  auto product = [&](const void* a, const void* b, float* c) {
    cpu_gemm_packed_direct(isa, f32_product(a, x, false, b, w, true, c));
  };
  const auto [huge, small] = time_pair(warm, reps, [&] { product(x.data(), w.data(), y.data_as<float>()); },
                                       [&] { product(xs.data(), ws.data(), ys.data()); });
  require(std::memcmp(ys.data(), y.data(), ys.size() * 4) == 0, "gpt2 pages: the two buffers' products differ");
  return Json{{"huge_ms", huge.median_ms}, {"small_ms", small.median_ms}, {"ratio", huge.median_ms / small.median_ms}};
}

// A linear layer's three products at m tokens (in -> out) on random operands: the tensors, the
// backend's arguments of forward (y = x w^T), dX (dy w) and dW (dy^T x), and each one's (M, N, K)
// as op(A) op(B) is M x K times K x N. The arguments point into the object: built in place.
struct LayerProducts {
  Tensor x, w, dy, y, dx, dw;
  GemmArgs ops[3];
  int64_t shapes[3][3];
  LayerProducts(int64_t m, int64_t in, int64_t out, uint64_t seed) {
    Rng rng(seed);
    x = random_matrix(m, in, 1.0f, rng);
    w = random_matrix(out, in, 1.0f / std::sqrt(static_cast<float>(in)), rng);
    dy = random_matrix(m, out, 1e-2f, rng);
    y = Tensor::empty(Shape{m, out}), dx = Tensor::empty(Shape{m, in}), dw = Tensor::empty(Shape{out, in});
    ops[0] = {&x, false, &w, true, &y, 0.0f, nullptr};
    ops[1] = {&dy, false, &w, false, &dx, 0.0f, nullptr};
    ops[2] = {&dy, true, &x, false, &dw, 0.0f, nullptr};
    const int64_t mnk[3][3] = {{m, out, in}, {m, in, out}, {out, in, m}};
    std::memcpy(shapes, mnk, sizeof shapes);
  }
  LayerProducts(const LayerProducts&) = delete;
  LayerProducts& operator=(const LayerProducts&) = delete;
  // The three outputs against FP64 (check_product).
  void check(const std::string& what) const {
    check_product(x, false, w, true, y, what + " forward");
    check_product(dy, false, w, false, dx, what + " dX");
    check_product(dy, true, x, false, dw, what + " dW");
  }
  Json product_json(int i, const Timing& t, double flops, double peak) const {
    const double g = flops / (t.median_ms * 1e6);
    return Json{{"m", shapes[i][0]}, {"n", shapes[i][1]}, {"k", shapes[i][2]}, {"time", to_json(t)},
                {"gflops", g}, {"fraction_of_peak", g / peak}};
  }
};

// The default GPT's linear layers (width 128, MLP 512, vocabulary 256: `belay train --model gpt`)
// at 1024 and 2048 tokens (batch 16 and 32 of context 64): small K or N, where packing op(A)
// is paid for few panels of B. fp32 through the backend, as a fraction of the FMA peak.
constexpr GptLinear kGptDefault[] = {
    {"attn.q", 128, 128}, {"mlp.fc", 128, 512}, {"mlp.proj", 512, 128}, {"head", 128, 256}};

Json bench_gpt_default_shapes(const Options& o, double peak) {
  const Backend& be = backend_for(Device::cpu());
  const CpuIsa isa = active_cpu_isa();
  Json rows = Json::array();
  for (const int64_t m : {int64_t{1024}, int64_t{2048}}) {
    for (const GptLinear& l : kGptDefault) {
      const double flops = 2.0 * static_cast<double>(m) * l.in * l.out;
      const int reps = o.quick ? 15 : 41, warm = 3;
      LayerProducts p(m, l.in, l.out, static_cast<uint64_t>(m * 7 + l.out));
      Json entry{{"layer", l.name}, {"tokens", m}, {"in", l.in}, {"out", l.out}, {"flops", flops}};
      for (int i = 0; i < 3; ++i)
        entry[kProducts[i]] = p.product_json(i, time_it(warm, reps, [&] { be.gemm(p.ops[i]); }), flops, peak);
      p.check(std::string("gpt default ") + l.name);
      rows.push_back(entry);
    }
  }
  return Json{{"isa", cpu_isa_name(isa)}, {"fma_peak_gflops", peak}, {"threads", max_threads()}, {"rows", rows}};
}

Json bench_gpt2_shapes(const Options& o, double peak) {
  const Backend& be = backend_for(Device::cpu());
  const CpuIsa isa = active_cpu_isa();
  const Bf16Limit limit = bf16_limit(isa, o.quick ? 3 : 5, peak);
  const GemmBlocking bl = cpu_gemm_blocking(isa);
  Json rows = Json::array();
  const std::vector<int64_t> tokens = o.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096};
  for (const int64_t m : tokens) {
    for (const GptLinear& l : kGpt2Small) {
      if (o.quick && l.out > 4096) continue;
      if (l.in == 4096 && m != 4096) continue;  // the squares only
      const double flops = 2.0 * static_cast<double>(m) * l.in * l.out;
      const int reps = flops > 1e11 ? 3 : flops > 1e10 ? 5 : 9, warm = 1;
      LayerProducts p(m, l.in, l.out, static_cast<uint64_t>(m * 131 + l.out));
      Json entry{{"layer", l.name}, {"tokens", m}, {"in", l.in}, {"out", l.out}, {"flops", flops}};
      for (int i = 0; i < 3; ++i) {
        entry[kProducts[i]] = p.product_json(i, time_it(warm, reps, [&] { be.gemm(p.ops[i]); }), flops, peak);
        entry[kProducts[i]]["fraction_of_peak_beside"] =
            fraction_beside_peak(isa, [&] { be.gemm(p.ops[i]); }, flops, reps);
        entry[kProducts[i]]["wide_tile"] = wide_over_narrow(isa, p.ops[i], p.shapes[i][1], warm, reps);
      }
      if (m == 1024) entry["forward"]["pages"] = huge_over_small_pages(isa, p.x, p.w, p.y, warm, reps);
      p.check(std::string("gpt2 ") + l.name);
      entry["bf16"] = gpt2_bf16_products(p.x, p.w, p.dy, p.dw, flops, reps, limit, entry, l.name);
      rows.push_back(entry);
    }
  }
  return Json{{"isa", cpu_isa_name(isa)}, {"fma_peak_gflops", peak}, {"bf16_limit", limit.key},
              {"bf16_limit_gflops", limit.gflops}, {"threads", max_threads()},
              {"blocking", Json{{"mr", bl.mr}, {"nr", bl.nr}, {"kc", bl.kc}, {"mc", bl.mc}, {"nc", bl.nc},
                                {"report", cpu_gemm_blocking_report(isa)}}},
              {"caches", cpu_caches_report()}, {"rows", rows}};
}

}  // namespace

Json bench_gemm(const Options& o) {
  const Backend& be = backend_for(Device::cpu());
  const int64_t batch = 256;
  const double peak = fma_peak_gflops(active_cpu_isa(), o.quick ? 3 : 5);  // fp32 rows: fraction of it
  Json rows = Json::array();
  const std::vector<int64_t> widths = o.quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 4096};
  for (const int64_t n : widths) {
    const int reps = n >= 4096 ? 5 : n >= 1024 ? 10 : 50;
    const int warm = n >= 4096 ? 1 : 3;
    const double flops = 2.0 * static_cast<double>(batch) * n * n;
    Rng rng(static_cast<uint64_t>(n));
    const Tensor x = random_matrix(batch, n, 1.0f, rng), w = random_matrix(n, n, 1.0f / std::sqrt((float)n), rng);
    const Tensor dy = random_matrix(batch, n, 1e-2f, rng), bias = random_matrix(1, n, 0.1f, rng).reshape(Shape{n});
    Json entry{{"n", n}, {"batch", batch}, {"flops", flops}};

    // Eigen direct and belay, both FP32, timed alternately product by product (the ratio is
    // the target); then belay in bf16 and fp16.
    const CpuIsa isa = active_cpu_isa();
    Tensor ey = Tensor::empty(Shape{batch, n}), edx = Tensor::empty(Shape{batch, n}), edw = Tensor::empty(Shape{n, n});
    auto direct = [&](const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, const Tensor* bias_t) {
      GemmF32Args g = f32_product(a.data_as<float>(), a, ta, b.data_as<float>(), b, tb, c.data_as<float>());
      g.bias = bias_t ? bias_t->data_as<float>() : nullptr;
      cpu_gemm_f32_direct(isa, g);
    };
    const std::function<void()> eigen_ops[3] = {[&] { direct(x, false, w, true, ey, &bias); },
                                                [&] { direct(dy, false, w, false, edx, nullptr); },
                                                [&] { direct(dy, true, x, false, edw, nullptr); }};
    Json eigen_json, belay32_json;
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor xd = x.to(dt), wd = w.to(dt), dyd = dy.to(dt), bd = bias.to(dt);
      Tensor y = Tensor::empty(Shape{batch, n}, dt), dx = Tensor::empty(Shape{batch, n}, dt);
      Tensor dw = Tensor::empty(Shape{n, n}, DType::F32);
      GemmArgs fwd{&xd, false, &wd, true, &y, 0.0f, &bd};
      GemmArgs bx{&dyd, false, &wd, false, &dx, 0.0f, nullptr};
      GemmArgs bw{&dyd, true, &xd, false, &dw, 0.0f, nullptr};
      const std::function<void()> belay_ops[3] = {[&] { be.gemm(fwd); }, [&] { be.gemm(bx); }, [&] { be.gemm(bw); }};
      Timing t[3];
      for (int i = 0; i < 3; ++i) {
        if (dt == DType::F32) {
          const auto [te, tb] = time_pair(warm, reps, eigen_ops[i], belay_ops[i]);
          eigen_json[kProducts[i]] = Json{{"time", to_json(te)}, {"gflops", flops / (te.median_ms * 1e6)}};
          t[i] = tb;
        } else {
          t[i] = time_it(warm, reps, belay_ops[i]);
        }
      }
      if (dt == DType::F32) {
        Tensor yt = Tensor::empty(Shape{batch, n});  // check the product part
        const float *yp = ey.data_as<float>(), *bp = bias.data_as<float>();
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t j = 0; j < n; ++j) yt.data_as<float>()[i * n + j] = yp[i * n + j] - bp[j];
        check_product(x, false, w, true, yt, "eigen forward");
        check_product(dy, false, w, false, edx, "eigen dX");
        check_product(dy, true, x, false, edw, "eigen dW");
        eigen_json["isa"] = cpu_isa_name(isa);
        entry["eigen_fp32"] = eigen_json;
      }
      GemmArgs nobias = fwd;
      nobias.bias = nullptr;
      be.gemm(nobias);
      check_product(xd, false, wd, true, y, std::string("belay forward ") + dtype_name(dt));
      check_product(dyd, false, wd, false, dx, std::string("belay dX ") + dtype_name(dt));
      check_product(dyd, true, xd, false, dw, std::string("belay dW ") + dtype_name(dt));
      Json e;
      for (int i = 0; i < 3; ++i) {
        const double g = flops / (t[i].median_ms * 1e6);
        e[kProducts[i]] = Json{{"time", to_json(t[i])}, {"gflops", g}};
        if (dt == DType::F32) e[kProducts[i]]["fraction_of_peak"] = g / peak;
      }
      entry[std::string("belay_") + dtype_name(dt)] = e;
    }
    for (const char* op : {"forward", "dX", "dW"})
      entry["belay_fp32_over_eigen"][op] =
          entry["belay_fp32"][op]["gflops"].get<double>() / entry["eigen_fp32"][op]["gflops"].get<double>();
    rows.push_back(entry);
  }
  return Json{{"threads", max_threads()}, {"fma_peak_gflops", peak}, {"sizes", rows},
              {"gpt_default", bench_gpt_default_shapes(o, peak)}, {"gpt2_small", bench_gpt2_shapes(o, peak)}};
}

}  // namespace belay::bench
