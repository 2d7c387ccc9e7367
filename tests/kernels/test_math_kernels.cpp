// The CPU backend's ops behind the Var operators against FP64 (tests/kernels/math_ops_check.h,
// which tests/gpu/test_cuda_math.cpp runs on the CUDA backend too), and the property the ISA
// dispatch owes them: every vector path gives the same bits (the ops have one code path).
#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "tests/kernels/math_ops_check.h"

using namespace belay;
using namespace belay::test::math;

TEST_CASE("cpu unary ops (exp, log, tanh, sigmoid, pow) and their backward match FP64", "[kernels][math]") {
  check_unary(Device::cpu());
}

TEST_CASE("cpu binary_broadcast, broadcast_axis and sum_axis match FP64", "[kernels][math]") {
  check_broadcast(Device::cpu());
}

TEST_CASE("cpu softmax and log_softmax (plain and causal) and their backward match FP64", "[kernels][math]") {
  check_softmax(Device::cpu());
}

TEST_CASE("cpu transpose copies every bit", "[kernels][math]") { check_transpose(Device::cpu()); }

TEST_CASE("cpu math ops give the same bits on every ISA path", "[kernels][math]") {
  const std::string active = active_cpu_isa_name();
  const std::vector<float> xv = values(2000, 41, DType::F32, -3.0f, 3.0f);
  auto run = [&] {
    const Backend& be = backend_for(Device::cpu());
    Tensor x = Tensor::from_vector(xv, Shape{40, 50}, DType::F16);
    Tensor y = Tensor::empty(x.shape(), DType::F16), s = Tensor::empty(x.shape(), DType::F16);
    Tensor r = Tensor::empty(Shape{40}, DType::F32);
    be.unary(UnaryOp::Tanh, 0.0f, x, y);
    be.softmax(x, 50, false, false, s);
    be.sum_axis(x, AxisView{40, 50, 1}, 1.0f, r, false);
    std::vector<float> all = y.to_vector(), sv = s.to_vector(), rv = r.to_vector();
    all.insert(all.end(), sv.begin(), sv.end());
    all.insert(all.end(), rv.begin(), rv.end());
    return test::bits_of(all);
  };
  const std::vector<uint32_t> baseline = [&] {
    select_cpu_isa("baseline");
    return run();
  }();
  for (const char* isa : {"avx2", "avx512"}) {
    try {
      select_cpu_isa(isa);
    } catch (const Error&) {
      continue;  // this CPU lacks the path
    }
    INFO(isa);
    CHECK(run() == baseline);
  }
  select_cpu_isa(active);
}
