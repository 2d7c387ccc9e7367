// The CUDA attention kernels (kernels/cuda/attention_*.cu) against the FP64 reference of
// tests/kernels/attention_check.h, the CPU backend's check run on the device: FP32 on the SIMT
// kernels, FP16 and BF16 on the tensor cores, forward and backward (P, and dS in the backward,
// rounded to the dtype for their products, which the reference's bound is told: p_dtype).
// Then the backward over several tiles in every head dim, FP32 gradients of 16-bit inputs, the
// bits of two runs, and P's rounding measured. Under the emulator the shapes are the check's
// small set (every edge: T 1, 7, 64, 65, odd d, Tq != Tk both ways), T = 200 in one dtype only,
// and the multi-tile backward cases.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/attention_check.h"

using namespace belay;
using namespace belay::test;

namespace {

// Where the backend rounds P: to the input dtype on the tensor cores, nowhere on FP32.
DType p_dtype_of(DType dt) { return dt == DType::F32 ? DType::F32 : dt; }

void check_all_cases(DType dt) {
  for (const attention::Case& c : attention::cases(true)) attention::check_case(Device::cuda(), c, dt, p_dtype_of(dt));
}

}  // namespace

TEST_CASE("cuda attention fp32 (SIMT) forward and backward match FP64", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  check_all_cases(DType::F32);
}

TEST_CASE("cuda attention fp16 (tensor cores) forward and backward match FP64", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  check_all_cases(DType::F16);
}

TEST_CASE("cuda attention bf16 (tensor cores) forward and backward match FP64", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  check_all_cases(DType::BF16);
}

TEST_CASE("cuda attention over 200 keys in four tiles matches FP64 causal and not", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  // One dtype under the emulator (every fiber of 4 x 7 blocks runs on the CPU); all on a GPU.
  const std::vector<DType> dtypes = kEmulated ? std::vector<DType>{DType::F16}
                                              : std::vector<DType>{DType::F32, DType::F16, DType::BF16};
  for (DType dt : dtypes)
    for (bool causal : {false, true}) attention::check_case(Device::cuda(), {1, 200, 200, 64, causal}, dt, p_dtype_of(dt));
}

TEST_CASE("cuda attention backward on tensor cores over several tiles in every head dim and with Tq unlike Tk",
          "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  // 3 items of 130 queries (3 tiles of 64, the last of 2 rows) and keys: dK / dV sum 3 query
  // tiles (causal: from the first that sees the block's keys), dQ 3 key tiles, both through both
  // pipeline stages; d 128 takes the dK / dV kernel's two halves of 32 queries. Then more keys
  // than queries and fewer (causal: the first rows see none), at both padded head dims.
  std::vector<attention::Case> cases;
  for (bool causal : {false, true}) {
    for (int64_t d : {16, 32, 64, 128}) cases.push_back({3, 130, 130, d, causal});
    for (int64_t d : {40, 128}) {
      cases.push_back({2, 70, 200, d, causal});
      cases.push_back({2, 200, 70, d, causal});
    }
  }
  for (DType dt : {DType::F16, DType::BF16})
    for (const attention::Case& c : cases) attention::check_case(Device::cuda(), c, dt, dt);
}

TEST_CASE("cuda attention with a head dim that is not a multiple of 8: rows padded for cp.async", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  // d 20 and 75: 16-bit rows that are not whole 16-byte chunks, so q, k, v (and dO in the
  // backward) are first copied into zero-padded rows of 24 and 80 (cuda_backend.cpp).
  for (DType dt : {DType::F16, DType::BF16})
    for (bool causal : {false, true})
      for (const attention::Case& c : {attention::Case{2, 70, 70, 20, causal}, attention::Case{1, 65, 33, 75, causal}})
        attention::check_case(Device::cuda(), c, dt, dt);
}

TEST_CASE("cuda attention backward on tensor cores into fp32 gradients matches FP64", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  // dq, dk, dv as FP32 buffers (what autograd passes for an input whose gradient is FP32): no
  // final rounding, so the bound is the arithmetic's alone, P's and dS's rounding included.
  for (DType dt : {DType::F16, DType::BF16})
    for (const attention::Case& c : {attention::Case{2, 65, 65, 64, true}, attention::Case{2, 130, 70, 128, false}})
      attention::check_case(Device::cuda(), c, dt, dt, DType::F32);
}

TEST_CASE("cuda attention repeats its bits: forward and backward, run twice", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  for (DType dt : math::kMathDtypes) {
    INFO(dtype_name(dt));
    const attention::Case c{3, 65, 65, 40, true};
    const attention::Outputs a = attention::check_case(Device::cuda(), c, dt, p_dtype_of(dt));
    const attention::Outputs b = attention::check_case(Device::cuda(), c, dt, p_dtype_of(dt));
    CHECK(attention::same_bits(a, b));
  }
  // The tensor-core backward over 3 x 3 tiles at d 128, where dK / dV and dQ each add 3 tiles.
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dt) << " over several tiles");
    const attention::Case c{2, 130, 130, 128, true};
    const attention::Outputs a = attention::check_case(Device::cuda(), c, dt, dt);
    const attention::Outputs b = attention::check_case(Device::cuda(), c, dt, dt);
    CHECK(attention::same_bits(a, b));
  }
}

TEST_CASE("cuda attention: P rounded to the dtype for P V costs at most its unit roundoff per term", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  // out_ic = sum_j p_ij v_jc with p_ij rounded to the dtype: measured against FP64 in units of
  // u_dtype * sum_j p_ij |v_jc| (the term the reference's bound adds for it), after what the
  // FP32 arithmetic and out's own rounding allow.
  for (DType dt : {DType::F16, DType::BF16}) {
    const attention::Case c{2, 64, 64, 64, false};
    const int64_t n = c.items * c.tq * c.d;
    const std::vector<float> qv = math::values(n, 501, dt), kv = math::values(n, 502, dt);
    const std::vector<float> vv = math::values(n, 503, dt), gv = math::values(n, 504, dt);
    const float scale = 0.125f;
    const attention::Outputs got = attention::run(gpu(), c, dt, dt, Device::cuda(), qv, kv, vv, gv, scale);
    const attention::Reference with_p = attention::reference(c, qv, kv, vv, gv, got.out, scale, dt, dt);
    const attention::Reference fp32_p = attention::reference(c, qv, kv, vv, gv, got.out, scale, dt, DType::F32);
    const double u = unit_roundoff(dt);
    double beyond = -1e300, measured = 0.0;  // in units of P's rounding term u sum_j p_ij |v_jc|
    for (int64_t e = 0; e < n; ++e) {
      const double p_term = with_p.out_err[e] - fp32_p.out_err[e];
      const double rest = fp32_p.out_err[e] + u * std::fabs(with_p.out[e]);  // FP32 arithmetic, out's rounding
      if (p_term <= 0.0) continue;
      const double err = std::fabs(got.out[e] - with_p.out[e]);
      beyond = std::max(beyond, (err - rest) / p_term);
      measured = std::max(measured, err / p_term);
    }
    CHECK(beyond <= 1.0);  // what the FP32 arithmetic and out's rounding leave is within P's term
    WARN(dtype_name(dt) << ": |out - FP64| at most " << measured << " u sum_j p_ij |v_j| (P's rounding, out's "
                        << "and FP32's together); beyond FP32's and out's own bounds: " << beyond);
  }
}

// Heads side by side ([B, T, H d], heads = 3): the CUDA backend copies them apart and back
// around its kernels, so the bits of the same call on the heads split apart by the caller.
TEST_CASE("cuda attention: heads side by side give the bits of the heads split apart", "[gpu][attention]") {
  BELAY_REQUIRE_GPU();
  const int64_t b = 2, h = 3, t = 65, d = 40;
  const Device gpu = Device::cuda();
  const Backend& be = backend_for(gpu);
  auto apart = [&](const Tensor& x) {
    Tensor out = Tensor::empty(Shape{b, h, t, d}, x.dtype(), gpu);
    be.swap_axes(x, SwapAxesView{b, t, 1, h, d}, out);
    return out;
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const Tensor q = attention::make(attention::values(b * t * h * d, 51, dt), Shape{b, t, h * d}, dt, gpu);
    const Tensor k = attention::make(attention::values(b * t * h * d, 52, dt), Shape{b, t, h * d}, dt, gpu);
    const Tensor v = attention::make(attention::values(b * t * h * d, 53, dt), Shape{b, t, h * d}, dt, gpu);
    const Tensor g = attention::make(attention::values(b * t * h * d, 54, dt), Shape{b, t, h * d}, dt, gpu);
    Tensor out = Tensor::empty(q.shape(), dt, gpu), lse = Tensor::empty(Shape{b, h, t}, DType::F32, gpu);
    Tensor dq = Tensor::empty(q.shape(), dt, gpu), dk = Tensor::empty(q.shape(), dt, gpu), dv = Tensor::empty(q.shape(), dt, gpu);
    be.attention(q, k, v, true, 0.15f, out, lse, h);
    be.attention_backward(q, k, v, out, lse, g, true, 0.15f, dq, dk, dv, h);
    const Tensor qs = apart(q), ks = apart(k), vs = apart(v), gs = apart(g);
    Tensor outs = Tensor::empty(qs.shape(), dt, gpu), lses = Tensor::empty(Shape{b, h, t}, DType::F32, gpu);
    Tensor dqs = Tensor::empty(qs.shape(), dt, gpu), dks = Tensor::empty(qs.shape(), dt, gpu), dvs = Tensor::empty(qs.shape(), dt, gpu);
    be.attention(qs, ks, vs, true, 0.15f, outs, lses);
    be.attention_backward(qs, ks, vs, outs, lses, gs, true, 0.15f, dqs, dks, dvs);
    CHECK(attention::same_bits(attention::host(apart(out)), attention::host(outs)));
    CHECK(attention::same_bits(attention::host(lse), attention::host(lses)));
    CHECK(attention::same_bits(attention::host(apart(dq)), attention::host(dqs)));
    CHECK(attention::same_bits(attention::host(apart(dk)), attention::host(dks)));
    CHECK(attention::same_bits(attention::host(apart(dv)), attention::host(dvs)));
  }
}
