// The CPU backend's fused attention: every case of tests/kernels/attention_check.h against the
// FP64 reference on every ISA path this CPU has, the same bits at every thread count and on
// every run, the FMA paths' bits equal to each other, and the reference's own backward against
// finite differences of its forward (so the bound is checked against the right gradient).
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "engine/error.h"
#include "engine/half_bits.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/attention_bf16.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/cpu_guards.h"

using namespace belay;
using belay::test::IsaRestore;
using belay::test::Threads;
namespace at = belay::test::attention;

namespace {

// The paths whose tiles differ (avx512bf16 and amx run avx512's, but for BF16 inputs: the pair
// products' tests below), those this CPU can run.
std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (cpu_isa_available(isa)) out.push_back(isa);
    else WARN("the " << cpu_isa_name(isa) << " path cannot run on this CPU: its attention tiles are not tested here");
  }
  return out;
}

}  // namespace

TEST_CASE("attention: fused forward and backward against FP64, every dtype and ISA path", "[attention]") {
  IsaRestore restore;
  for (CpuIsa isa : runnable_paths()) {
    force_cpu_isa(isa);
    INFO("ISA path " << cpu_isa_name(isa));
    for (const at::Case& c : at::cases(isa != best_cpu_isa()))
      for (DType dt : at::kMathDtypes) at::check_case(Device::cpu(), c, dt);
  }
}

TEST_CASE("attention: the same bits on every run and at every thread count", "[attention]") {
  // 3 items x 3 query blocks: the forward's (item, block) pairs and the backward's items split
  // differently over 1, 2 and 3 threads.
  const at::Case c{3, 80, 80, 48, true};
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::vector<float> q = at::values(3 * 80 * 48, 5, dt), k = at::values(3 * 80 * 48, 6, dt);
    const std::vector<float> v = at::values(3 * 80 * 48, 7, dt), g = at::values(3 * 80 * 48, 8, dt);
    const Backend& be = backend_for(Device::cpu());
    at::Outputs first;
    {
      Threads one(1);
      first = at::run(be, c, dt, DType::F32, Device::cpu(), q, k, v, g, 0.125f);
    }
    for (int n : {2, 3, 1}) {
      Threads t(n);
      INFO(dtype_name(dt) << " at " << n << " threads");
      CHECK(at::same_bits(first, at::run(be, c, dt, DType::F32, Device::cpu(), q, k, v, g, 0.125f)));
    }
  }
}

// The BF16 attention of the paths that multiply BF16 pairs (kernels/cpu/attention_bf16.cpp): amx
// on AMX tiles, avx512bf16 on VDPBF16PS, both rounding P and dS to BF16 for their products and
// reading inputs (and flushing sums) below 2^-126 as zero: the reference's bound is told both
// (p_dtype BF16, flush), nothing else. One check per concern, run on each path.
namespace {

// False, with the CTEST_SKIP warning, where this machine cannot run the path (no AVX512-BF16;
// for amx also no AMX, or Linux did not grant the tile data).
bool runs_here(CpuIsa isa) {
  if (cpu_isa_available(isa)) return true;
  std::string missing;
  for (const std::string& m : cpu_isa_missing(isa)) missing += (missing.empty() ? "" : ", ") + m;
  WARN("CTEST_SKIP: the " << cpu_isa_name(isa) << " path needs " << missing << ", which this machine lacks (it has: "
                          << cpu_features_string() << ")");
  return false;
}

// T in {1, 7, 64, 65, 200} x d in {16, 32, 64, 128}, 3 items (not a multiple of a block), causal
// and not; and Tq != Tk both ways (the first rows of a causal 70 x 9 see nothing).
std::vector<at::Case> pair_cases() {
  std::vector<at::Case> out;
  for (bool causal : {false, true}) {
    for (int64_t t : {1, 7, 64, 65, 200})
      for (int64_t d : {16, 32, 64, 128}) out.push_back({3, t, t, d, causal});
    out.push_back({1, 1, 65, 64, causal});
    out.push_back({2, 70, 9, 40, causal});
  }
  return out;
}

// Every case of pair_cases() on the path against FP64, with BF16 gradients; and two with FP32
// gradients: no BF16 rounding of dq, dk, dv to hide the products' own error.
void check_against_fp64(CpuIsa isa) {
  IsaRestore restore;
  force_cpu_isa(isa);
  INFO("ISA path " << cpu_isa_name(isa));
  for (const at::Case& c : pair_cases()) at::check_case(Device::cpu(), c, DType::BF16, DType::BF16, std::nullopt, true);
  for (const at::Case& c : {at::Case{3, 65, 65, 64, true}, at::Case{2, 200, 200, 32, false}})
    at::check_case(Device::cpu(), c, DType::BF16, DType::BF16, DType::F32, true);
}

// 5 items x 4 query blocks of an odd head dim: the forward's (item, block) pairs and the
// backward's items split differently over 1, 2 and 3 threads.
void check_repeats(CpuIsa isa) {
  IsaRestore restore;
  force_cpu_isa(isa);
  const at::Case c{5, 100, 100, 48, true};
  const int64_t n = 5 * 100 * 48;
  const std::vector<float> q = at::values(n, 31, DType::BF16), k = at::values(n, 32, DType::BF16);
  const std::vector<float> v = at::values(n, 33, DType::BF16), g = at::values(n, 34, DType::BF16);
  const Backend& be = backend_for(Device::cpu());
  at::Outputs first;
  {
    Threads one(1);
    first = at::run(be, c, DType::BF16, DType::F32, Device::cpu(), q, k, v, g, 0.15f);
  }
  for (int threads : {2, 3, 1, 2}) {
    Threads t(threads);
    INFO(cpu_isa_name(isa) << " at " << threads << " threads");
    CHECK(at::same_bits(first, at::run(be, c, DType::BF16, DType::F32, Device::cpu(), q, k, v, g, 0.15f)));
  }
}

}  // namespace

TEST_CASE("attention amx: bf16 on AMX tiles against FP64, P and dS rounded to BF16", "[attention][amx]") {
  if (runs_here(CpuIsa::Amx)) check_against_fp64(CpuIsa::Amx);
}

TEST_CASE("attention amx: the same bits on every run and at every thread count", "[attention][amx]") {
  if (runs_here(CpuIsa::Amx)) check_repeats(CpuIsa::Amx);
}

TEST_CASE("attention avx512bf16: bf16 on VDPBF16PS against FP64, P and dS rounded to BF16",
          "[attention][avx512bf16]") {
  if (runs_here(CpuIsa::Avx512Bf16)) check_against_fp64(CpuIsa::Avx512Bf16);
}

TEST_CASE("attention avx512bf16: the same bits on every run and at every thread count", "[attention][avx512bf16]") {
  if (runs_here(CpuIsa::Avx512Bf16)) check_repeats(CpuIsa::Avx512Bf16);
}

// The two tables of BF16 pair products (kernels/cpu/isa/attention_bf16.h) where no sum rounds:
// small integers, so every product and partial sum is exact and VDPBF16PS (odd product of a pair
// first) must give the tile emulator's bits (even first), operand layouts and edges included.
// The attention tests above cannot tell a misplaced pair from the rounding they allow for.
TEST_CASE("attention avx512bf16: VDPBF16PS products equal the AMX tiles' where no sum rounds",
          "[attention][avx512bf16]") {
  if (!runs_here(CpuIsa::Avx512Bf16)) return;
  const AttentionBf16& vdp = isa_avx512bf16::attention_vdpbf16;
  const AttentionBf16& amx = isa_amx_emulated::attention_amx;
  // x: 50 rows of d = 40 BF16 (integers in [-8, 8]), padded as the attention pads: rows to 64,
  // d to 64. A: 64 rows of depth 64 (the same values, zero past them).
  const int64_t n = 50, d = 40, rows_to = 64, dp = 64;
  std::vector<uint16_t> x(static_cast<size_t>(n * d)), a(static_cast<size_t>(rows_to * dp), 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(static_cast<int>((i * 7919) % 17) - 8);
    x[i] = f32_to_bf16_bits(f);
    a[(i / d) * dp + i % d] = x[i];
  }
  std::vector<uint32_t> kp(static_cast<size_t>(rows_to * dp / 2)), kc(kp.size());
  vdp.pack_rows(x.data(), d, n, d, rows_to, kp.data());  // the same code in both tables
  vdp.pack_cols(x.data(), d, n, d, rows_to, kc.data());
  amx_emulator_reset_faults();
  amx.begin();
  for (bool accumulate : {false, true}) {
    for (const auto& [b, ps, m, cols, depth] : {std::tuple{kp.data(), 16 * dp, rows_to, rows_to, dp},  // A x^T
                                                std::tuple{kc.data(), 16 * rows_to, rows_to, dp, rows_to}}) {  // A x
      std::vector<float> got(static_cast<size_t>(m * cols), 1.0f), want(got);
      vdp.product(m, cols, depth, a.data(), dp, b, ps, got.data(), cols, accumulate);
      amx.product(m, cols, depth, a.data(), dp, b, ps, want.data(), cols, accumulate);
      INFO((accumulate ? "accumulate" : "overwrite") << ", depth " << depth);
      CHECK(at::same_bits(got, want));
      CHECK(std::any_of(got.begin(), got.end(), [](float f) { return std::fabs(f) > 64.0f; }));  // not all zero
    }
  }
  amx.end();
  CHECK(amx_emulator_faults() == 0);
}

// The amx path's own code (kernels/cpu/attention_bf16.cpp, kernels/cpu/isa/attention_amx.cpp:
// the packing into tiles, the block products, the roundings, the edges) on the emulator of the
// tile instructions, on every CPU, against the same bound. The emulator counts anything the
// hardware would fault on; none may happen.
TEST_CASE("attention amx (emulated tiles): bf16 against FP64, P and dS rounded to BF16", "[attention][amx]") {
  const at::Runner emulated = [](const at::Case& c, DType dt, DType grad_dt, const std::vector<float>& qv,
                                 const std::vector<float>& kv, const std::vector<float>& vv,
                                 const std::vector<float>& gv, float scale) {
    const Device cpu = Device::cpu();
    const Shape sq{c.items, c.tq, c.d}, sk{c.items, c.tk, c.d};
    const Tensor q = at::make(qv, sq, dt, cpu), k = at::make(kv, sk, dt, cpu), v = at::make(vv, sk, dt, cpu);
    const Tensor g = at::make(gv, sq, dt, cpu);
    Tensor out = Tensor::empty(sq, dt, cpu), lse = Tensor::empty(Shape{c.items, c.tq}, DType::F32, cpu);
    Tensor dq = Tensor::empty(sq, grad_dt, cpu), dk = Tensor::empty(sk, grad_dt, cpu);
    Tensor dv = Tensor::empty(sk, grad_dt, cpu);
    const AttentionDims dims{c.items, c.tq, c.tk, c.d};
    cpu::attention_amx_emulated(q, k, v, c.causal, scale, dims, out, lse);
    cpu::attention_backward_amx_emulated(q, k, v, out, lse, g, c.causal, scale, dims, dq, dk, dv);
    return at::Outputs{at::host(out), at::host(lse), at::host(dq), at::host(dk), at::host(dv)};
  };
  amx_emulator_reset_faults();
  for (bool causal : {false, true}) {
    const at::Case cases[] = {{3, 7, 7, 16, causal}, {3, 65, 65, 32, causal}, {2, 70, 9, 40, causal},
                              {1, 1, 65, 64, causal}, {2, 100, 100, 128, causal}};
    for (const at::Case& c : cases)
      at::check_case(Device::cpu(), c, DType::BF16, DType::BF16, std::nullopt, true, emulated);
    at::check_case(Device::cpu(), {2, 130, 130, 64, causal}, DType::BF16, DType::BF16, DType::F32, true, emulated);
  }
  INFO("first fault: " << amx_emulator_first_fault());
  CHECK(amx_emulator_faults() == 0);
}

// Not a test (hidden: run it by its tag): the worst error against the FP64 reference of the
// BF16 attention on the FP32 tiles (avx512), on VDPBF16PS (avx512bf16) and on AMX tiles (amx),
// those this machine has, in units of the reference's magnitude, at a GPT-2-like head (d 64,
// causal); docs/attention.md quotes it.
TEST_CASE("attention bf16: error against FP64, FP32 tiles vs BF16 pair products (prints)", "[.][attention-error]") {
  IsaRestore restore;
  const at::Case c{4, 512, 512, 64, true};
  const int64_t n = 4 * 512 * 64;
  const std::vector<float> q = at::values(n, 41, DType::BF16), k = at::values(n, 42, DType::BF16);
  const std::vector<float> v = at::values(n, 43, DType::BF16), g = at::values(n, 44, DType::BF16);
  const float scale = 0.125f;
  const auto worst = [](const std::vector<float>& got, const std::vector<double>& ref) {
    double err = 0.0, mag = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - ref[i]));
      mag = std::max(mag, std::fabs(ref[i]));
    }
    return err / mag;
  };
  for (CpuIsa isa : {CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx}) {
    if (!runs_here(isa)) continue;
    force_cpu_isa(isa);
    const at::Outputs o =
        at::run(backend_for(Device::cpu()), c, DType::BF16, DType::F32, Device::cpu(), q, k, v, g, scale);
    const at::Reference r = at::reference(c, q, k, v, g, o.out, scale, DType::BF16, DType::F32);
    WARN(cpu_isa_name(isa) << ": worst |error| / max |reference|: out (bf16) " << worst(o.out, r.out) << ", dq (fp32) "
                           << worst(o.dq, r.dq) << ", dk " << worst(o.dk, r.dk) << ", dv " << worst(o.dv, r.dv));
  }
}

TEST_CASE("attention: avx2 and avx512 tiles give the same bits (both fuse each multiply-add)", "[attention]") {
  if (!cpu_isa_available(CpuIsa::Avx2) || !cpu_isa_available(CpuIsa::Avx512)) {
    WARN("CTEST_SKIP: needs both the avx2 and the avx512 path on this CPU");
    return;
  }
  IsaRestore restore;
  // d = 40: three avx512 vectors a row; d = 32 and 16: two or one, where avx512 weighs 8 rows at
  // a time (attention_tiles.cpp) and avx2 2 or 4.
  for (const int64_t d : {40, 32, 16}) {
    INFO("d " << d);
    const at::Case c{2, 70, 70, d, true};
    const int64_t n = 2 * 70 * d;
    const std::vector<float> q = at::values(n, 9, DType::F32), k = at::values(n, 10, DType::F32);
    const std::vector<float> v = at::values(n, 11, DType::F32), g = at::values(n, 12, DType::F32);
    const Backend& be = backend_for(Device::cpu());
    force_cpu_isa(CpuIsa::Avx2);
    const at::Outputs a = at::run(be, c, DType::F32, DType::F32, Device::cpu(), q, k, v, g, 0.2f);
    force_cpu_isa(CpuIsa::Avx512);
    CHECK(at::same_bits(a, at::run(be, c, DType::F32, DType::F32, Device::cpu(), q, k, v, g, 0.2f)));
  }
}

TEST_CASE("attention: the FP64 reference's gradients match finite differences of its forward", "[attention]") {
  // L = sum(out * g): dL/dq etc. by central differences in FP64 on a small case, causal with
  // more queries than keys (masked rows), so the bound's reference is the true gradient.
  const at::Case c{1, 5, 4, 3, true};
  std::vector<float> q = at::values(15, 21, DType::F32), k = at::values(12, 22, DType::F32);
  std::vector<float> v = at::values(12, 23, DType::F32);
  const std::vector<float> g = at::values(15, 24, DType::F32);
  const float scale = 0.7f;
  const auto loss = [&] {
    const at::Reference r = at::reference(c, q, k, v, g, std::vector<float>(15, 0.0f), scale, DType::F32, DType::F32);
    double s = 0.0;
    for (size_t i = 0; i < r.out.size(); ++i) s += r.out[i] * g[i];
    return s;
  };
  // The reference's D needs the forward's out: give it the FP32-rounded reference output.
  const at::Reference r0 = at::reference(c, q, k, v, g, std::vector<float>(15, 0.0f), scale, DType::F32, DType::F32);
  std::vector<float> o(r0.out.begin(), r0.out.end());
  const at::Reference r = at::reference(c, q, k, v, g, o, scale, DType::F32, DType::F32);
  const auto check_grad = [&](std::vector<float>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const float saved = x[i], h = 1.0f / 1024;  // x +- h exactly representable
      x[i] = saved + h;
      const double up = loss();
      x[i] = saved - h;
      const double down = loss();
      x[i] = saved;
      INFO(name << "[" << i << "]");
      CHECK(std::fabs((up - down) / (2 * h) - grad[i]) <= 1e-5 * (1.0 + std::fabs(grad[i])));
    }
  };
  check_grad(q, r.dq, "dq");
  check_grad(k, r.dk, "dk");
  check_grad(v, r.dv, "dv");
}

TEST_CASE("attention: refuses shapes it does not take, with the op's name", "[attention]") {
  const Device cpu = Device::cpu();
  const Backend& be = backend_for(cpu);
  Tensor lse = Tensor::empty(Shape{2, 4}, DType::F32, cpu);
  const Tensor q = Tensor::zeros(Shape{2, 4, 8}, DType::F32, cpu);
  Tensor out = Tensor::empty(Shape{2, 4, 8}, DType::F32, cpu);
  const Tensor k_bad_d = Tensor::zeros(Shape{2, 5, 9}, DType::F32, cpu);
  CHECK_THROWS_WITH(be.attention(q, k_bad_d, k_bad_d, true, 1.0f, out, lse), Catch::Contains("attention: k and v"));
  const Tensor k_bf = Tensor::zeros(Shape{2, 5, 8}, DType::BF16, cpu);
  CHECK_THROWS_WITH(be.attention(q, k_bf, k_bf, true, 1.0f, out, lse), Catch::Contains("share one dtype"));
  const Tensor wide = Tensor::zeros(Shape{1, 2, 129}, DType::F32, cpu);
  Tensor wide_out = Tensor::empty(wide.shape(), DType::F32, cpu), wide_lse = Tensor::empty(Shape{2}, DType::F32, cpu);
  CHECK_THROWS_WITH(be.attention(wide, wide, wide, false, 1.0f, wide_out, wide_lse), Catch::Contains("head dim 129"));
  Tensor short_lse = Tensor::empty(Shape{7}, DType::F32, cpu);
  CHECK_THROWS_WITH(be.attention(q, q, q, false, 1.0f, out, short_lse), Catch::Contains("one value per query row"));
  CHECK_THROWS_WITH(be.attention(q, q, q, false, 1.0f, const_cast<Tensor&>(q), lse), Catch::Contains("attention"));
}

// ---- Heads side by side (AttentionDims::heads): q, k, v [B, T, H d] as the Linears give them,
// read in place with a row stride of H d. The same operations on the same values as on the
// heads split into [B, H, T, d], so the same bits: out, lse, dq, dk, dv, on every path (FP32
// tiles, BF16 pair products on AMX tiles, VDPBF16PS and the tile emulator).
namespace {

using AttentionFn = void (*)(const Tensor&, const Tensor&, const Tensor&, bool, float, const AttentionDims&, Tensor&,
                             Tensor&);
using AttentionBackwardFn = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, bool, float, const AttentionDims&, Tensor&, Tensor&, Tensor&);

// [B, T, H d] -> [B, H, T, d]
Tensor heads_apart(const Tensor& x, int64_t b, int64_t t, int64_t h, int64_t d) {
  Tensor out = Tensor::empty(Shape{b, h, t, d}, x.dtype(), x.device());
  backend_for(x.device()).swap_axes(x, SwapAxesView{b, t, 1, h, d}, out);
  return out;
}

// Both layouts through `fwd` and `bwd` (the CPU backend's entry points or the emulated tiles').
void check_heads_layout(AttentionFn fwd, AttentionBackwardFn bwd, DType dt, DType grad_dt, const char* what) {
  const int64_t b = 2, h = 3, d = 40;
  for (bool causal : {true, false})
    for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{70, 70}, std::pair<int64_t, int64_t>{9, 70}}) {
      INFO(what << ", " << dtype_name(dt) << " grads " << dtype_name(grad_dt) << ", Tq " << tq << " Tk " << tk
                << (causal ? " causal" : ""));
      const Device cpu = Device::cpu();
      const Tensor q = at::make(at::values(b * tq * h * d, 41, dt), Shape{b, tq, h * d}, dt, cpu);
      const Tensor k = at::make(at::values(b * tk * h * d, 42, dt), Shape{b, tk, h * d}, dt, cpu);
      const Tensor v = at::make(at::values(b * tk * h * d, 43, dt), Shape{b, tk, h * d}, dt, cpu);
      const Tensor g = at::make(at::values(b * tq * h * d, 44, dt), Shape{b, tq, h * d}, dt, cpu);
      const float scale = 0.15f;
      // Side by side.
      const AttentionDims side{b * h, tq, tk, d, h};
      Tensor out = Tensor::empty(q.shape(), dt, cpu), lse = Tensor::empty(Shape{b, h, tq}, DType::F32, cpu);
      Tensor dq = Tensor::empty(q.shape(), grad_dt, cpu), dk = Tensor::empty(k.shape(), grad_dt, cpu);
      Tensor dv = Tensor::empty(v.shape(), grad_dt, cpu);
      fwd(q, k, v, causal, scale, side, out, lse);
      bwd(q, k, v, out, lse, g, causal, scale, side, dq, dk, dv);
      // Split apart.
      const Tensor qs = heads_apart(q, b, tq, h, d), ks = heads_apart(k, b, tk, h, d), vs = heads_apart(v, b, tk, h, d);
      const Tensor gs = heads_apart(g, b, tq, h, d);
      const AttentionDims apart{b * h, tq, tk, d, 1};
      Tensor outs = Tensor::empty(qs.shape(), dt, cpu), lses = Tensor::empty(Shape{b, h, tq}, DType::F32, cpu);
      Tensor dqs = Tensor::empty(qs.shape(), grad_dt, cpu), dks = Tensor::empty(ks.shape(), grad_dt, cpu);
      Tensor dvs = Tensor::empty(vs.shape(), grad_dt, cpu);
      fwd(qs, ks, vs, causal, scale, apart, outs, lses);
      bwd(qs, ks, vs, outs, lses, gs, causal, scale, apart, dqs, dks, dvs);
      CHECK(at::same_bits(at::host(heads_apart(out, b, tq, h, d)), at::host(outs)));
      CHECK(at::same_bits(at::host(lse), at::host(lses)));
      CHECK(at::same_bits(at::host(heads_apart(dq, b, tq, h, d)), at::host(dqs)));
      CHECK(at::same_bits(at::host(heads_apart(dk, b, tk, h, d)), at::host(dks)));
      CHECK(at::same_bits(at::host(heads_apart(dv, b, tk, h, d)), at::host(dvs)));
    }
}

}  // namespace

TEST_CASE("attention: heads side by side give the bits of the heads split apart, every path", "[attention]") {
  IsaRestore restore;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    force_cpu_isa(isa);
    for (DType dt : {DType::F32, DType::BF16})
      for (DType grad_dt : {dt, DType::F32})
        check_heads_layout(cpu::attention, cpu::attention_backward, dt, grad_dt, cpu_isa_name(isa));
  }
  amx_emulator_reset_faults();
  check_heads_layout(cpu::attention_amx_emulated, cpu::attention_backward_amx_emulated, DType::BF16, DType::BF16,
                     "amx emulated");
  CHECK(amx_emulator_faults() == 0);
}

TEST_CASE("attention: heads that do not divide the last dim are refused", "[attention]") {
  const Device cpu = Device::cpu();
  const Tensor q = Tensor::zeros(Shape{2, 4, 8}, DType::F32, cpu);
  Tensor out = Tensor::empty(q.shape(), DType::F32, cpu), lse = Tensor::empty(Shape{2, 3, 4}, DType::F32, cpu);
  CHECK_THROWS_WITH(backend_for(cpu).attention(q, q, q, true, 1.0f, out, lse, 3), Catch::Contains("3 heads do not divide"));
}
