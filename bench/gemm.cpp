// GEMM: the three products of a linear layer Y = X W^T + b at batch B = 256 and width n
// (in = out = n): forward Y = X W^T (+ b), dX = dY W, dW = dY^T X. belay's CPU matmul (the
// backend's gemm, fp32 and bf16/fp16 with FP32 accumulation) against Eigen called directly
// on FP32 matrices with the same expression, compiled with the same flags (the active ISA
// path's Eigen product, kernels/cpu/isa/, called without belay's wrapper): the ratio is
// what belay's wrapper costs (dtype widening, scratch, rounding). 2*B*n*n flops each.
//
// Check: 16 sampled outputs of every product against an FP64 dot product of the operands
// as stored, within 2k*2^-24*sum|a*b| plus the output rounding.
#include <cmath>

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

}  // namespace

Json bench_gemm(const Options& o) {
  const Backend& be = backend_for(Device::cpu());
  const int64_t batch = 256;
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
      GemmF32Args g;
      g.a = a.data_as<float>();
      g.a_rows = a.dim(0);
      g.a_cols = a.dim(1);
      g.trans_a = ta;
      g.b = b.data_as<float>();
      g.b_rows = b.dim(0);
      g.b_cols = b.dim(1);
      g.trans_b = tb;
      g.c = c.data_as<float>();
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
      for (int i = 0; i < 3; ++i) e[kProducts[i]] = Json{{"time", to_json(t[i])}, {"gflops", flops / (t[i].median_ms * 1e6)}};
      entry[std::string("belay_") + dtype_name(dt)] = e;
    }
    for (const char* op : {"forward", "dX", "dW"})
      entry["belay_fp32_over_eigen"][op] =
          entry["belay_fp32"][op]["gflops"].get<double>() / entry["eigen_fp32"][op]["gflops"].get<double>();
    rows.push_back(entry);
  }
  return Json{{"threads", max_threads()}, {"sizes", rows}};
}

}  // namespace belay::bench
