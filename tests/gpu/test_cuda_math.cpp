// The CUDA kernels behind the Var operators (math_kernels.cu, softmax_kernels.cu) against the
// same FP64 references as the CPU backend (tests/kernels/math_ops_check.h), bit for bit
// against the CPU where both compute the same FP32 operations in the same order (broadcast
// arithmetic, sum_axis's ordered double sums, transpose), and the Var ops end to end on
// the device with their gradients against the CPU's.
#include "autograd/ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/math_ops_check.h"

using namespace belay;
using namespace belay::test;

TEST_CASE("cuda unary ops and their backward match FP64", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  math::check_unary(Device::cuda());
}

TEST_CASE("cuda binary_broadcast, broadcast_axis and sum_axis match FP64", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  math::check_broadcast(Device::cuda());
}

TEST_CASE("cuda softmax and log_softmax (plain and causal) and their backward match FP64", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  math::check_softmax(Device::cuda());
}

TEST_CASE("cuda transpose copies every bit", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  math::check_transpose(Device::cuda());
}

TEST_CASE("cuda broadcast arithmetic and sum_axis give the CPU's bits", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  const AxisView v{3, 130, 5};  // a middle axis longer than a block
  for (DType dt : math::kMathDtypes) {
    INFO(name_of(dt));
    const int64_t full_n = v.outer * v.len * v.inner, small_n = v.outer * v.inner;
    Pair a = make_pair(Shape{full_n}, dt, 51), b = make_pair(Shape{small_n}, dt, 52, 0.5f, 2.0f);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
      Tensor oc = Tensor::empty(Shape{full_n}, dt, Device::cpu()), og = Tensor::empty(Shape{full_n}, dt, Device::cuda());
      cpu().binary_broadcast(op, a.host, b.host, v, true, oc);
      gpu().binary_broadcast(op, a.device, b.device, v, true, og);
      CHECK(bits_of(og.to(Device::cpu())) == bits_of(oc));
    }
    Tensor sc = Tensor::empty(Shape{small_n}, DType::F32, Device::cpu());
    Tensor sg = Tensor::empty(Shape{small_n}, DType::F32, Device::cuda());
    cpu().sum_axis(a.host, v, 0.5f, sc, false);
    gpu().sum_axis(a.device, v, 0.5f, sg, false);
    CHECK(bits_of(sg.to(Device::cpu())) == bits_of(sc));
    Tensor bc = Tensor::empty(Shape{full_n}, dt, Device::cpu()), bg = Tensor::empty(Shape{full_n}, dt, Device::cuda());
    cpu().broadcast_axis(b.host, v, 2.0f, bc);
    gpu().broadcast_axis(b.device, v, 2.0f, bg);
    CHECK(bits_of(bg.to(Device::cpu())) == bits_of(bc));
  }
}

TEST_CASE("cuda Var operators: values and gradients as on the CPU", "[gpu][math]") {
  BELAY_REQUIRE_GPU();
  // One graph through every new op; the CPU's results are the reference (each op is checked
  // against FP64 above), within the tolerance of a few dozen FP32 roundings.
  auto run = [](Device dev) {
    Var x(math::make(math::values(24, 61, DType::F32), Shape{4, 6}, DType::F32, dev), true);
    Var row(math::make(math::values(6, 62, DType::F32, 1.0f, 2.0f), Shape{6}, DType::F32, dev), true);
    Var h = div(sub(tanh(x), row), row);
    Var p = log_softmax(add(mul(sigmoid(h), exp(neg(x))), pow(x, 2.0f)));
    Var s = sum(mean(add(softmax(transpose(p)), reshape(select_row(x, 1), {6, 1})), 1, true), 0);
    Var loss = sum(mul(s, log(add(s, Var(math::make({3.0f}, Shape{1}, DType::F32, dev))))));
    loss.backward();
    std::vector<float> out = math::host(loss.value());
    for (const Tensor* t : {&x.grad(), &row.grad()}) {
      const std::vector<float> g = math::host(*t);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  check_graph_matches_cpu(run(Device::cuda()), run(Device::cpu()));
}
