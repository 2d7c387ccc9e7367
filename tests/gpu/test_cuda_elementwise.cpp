// CUDA elementwise ops against an FP64 reference of the same (already rounded) inputs,
// through the one tolerance helper, and bit for bit against the CPU backend where both
// compute one correctly rounded FP32 operation followed by the same rounding.
#include <cmath>

#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/gelu_tanh_reference.h"

using namespace belay;
using namespace belay::test;

namespace {

const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

void require_same_bits(const Tensor& gpu_result, const Tensor& cpu_result) {
  const std::vector<float> g = gpu_result.to_vector(), c = cpu_result.to_vector();
  REQUIRE(g.size() == c.size());
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (f32_bits(g[i]) != f32_bits(c[i])) ++differ;
  INFO(differ << " of " << g.size() << " elements differ in their bits from the CPU backend");
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("cuda cast and fill give the CPU's bits", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType from : kDtypes)
      for (DType to : kDtypes) {
        // Wide range: overflow to inf in FP16, subnormals, and rounding ties all occur.
        std::vector<float> v = random_values(n, 11 + n, -70000.0f, 70000.0f, from);
        for (size_t i = 0; i < v.size(); i += 3) v[i] *= 1e-6f;
        Pair x = make_pair(v, Shape{n}, from);
        Tensor yc = Tensor::empty(Shape{n}, to, Device::cpu()), yg = Tensor::empty(Shape{n}, to, Device::cuda());
        cpu().cast(x.host, yc);
        gpu().cast(x.device, yg);
        INFO(name_of(from) << " -> " << name_of(to) << ", n = " << n);
        require_same_bits(yg, yc);
        gpu().fill(yg, 0.1f);
        cpu().fill(yc, 0.1f);
        require_same_bits(yg, yc);
      }
}

TEST_CASE("cuda scale_cast gives the CPU's bits", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType to : kDtypes)
      for (float f : {65536.0f, 3.0e-5f}) {  // overflow to inf in FP16 at 2^16; subnormals at 3e-5
        Pair x = make_pair(random_values(n, 29 + n, -3.0f, 3.0f, DType::F32), Shape{n}, DType::F32);
        const Tensor fc = Tensor::full(Shape{1}, f), fg = fc.to(Device::cuda());
        Tensor yc = Tensor::empty(Shape{n}, to, Device::cpu()), yg = Tensor::empty(Shape{n}, to, Device::cuda());
        cpu().scale_cast(x.host, fc, yc);
        gpu().scale_cast(x.device, fg, yg);
        INFO("-> " << name_of(to) << ", factor " << f << ", n = " << n);
        require_same_bits(yg, yc);
      }
}

TEST_CASE("cuda clone keeps every bit pattern, signalling NaNs included", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  // A same-dtype cast is a copy (as the CPU's memmove), not a round trip through FP32.
  for (DType d : {DType::F16, DType::BF16}) {
    Tensor h = Tensor::empty(Shape{65536}, d, Device::cpu());
    for (uint32_t i = 0; i < 65536; ++i) h.data_as<uint16_t>()[i] = static_cast<uint16_t>(i);
    const Tensor back = h.to(Device::cuda()).clone().to(Device::cpu());
    int differ = 0;
    for (int i = 0; i < 65536; ++i) differ += back.data_as<uint16_t>()[i] != h.data_as<uint16_t>()[i];
    INFO(name_of(d) << ": " << differ << " of 65536 patterns changed");
    CHECK(differ == 0);
  }
}

TEST_CASE("cuda binary, scale and broadcast_scalar match FP64 and the CPU's bits", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes)
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
        Pair a = make_pair(Shape{n}, d, 1 + n), b = make_pair(Shape{n}, d, 2 + n);
        Tensor og = Tensor::empty(Shape{n}, d, Device::cuda()), oc = Tensor::empty(Shape{n}, d, Device::cpu());
        gpu().binary(op, a.device, b.device, og);
        cpu().binary(op, a.host, b.host, oc);
        const std::vector<float> av = a.host.to_vector(), bv = b.host.to_vector();
        std::vector<double> want(av.size());
        for (size_t i = 0; i < av.size(); ++i)
          want[i] = op == BinaryOp::Add ? (double)av[i] + bv[i] : op == BinaryOp::Sub ? (double)av[i] - bv[i]
                                                                                       : (double)av[i] * bv[i];
        INFO(name_of(d) << " op " << static_cast<int>(op) << ", n = " << n);
        check_close(og.to_vector(), want, tolerance_for(d, d, 1));
        require_same_bits(og, oc);
        // In place (out aliases a), as autograd uses it.
        gpu().binary(op, a.device, b.device, a.device);
        require_same_bits(a.device, oc);
      }
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes) {
      Pair x = make_pair(Shape{n}, d, 3 + n);
      Tensor og = Tensor::empty(Shape{n}, d, Device::cuda()), oc = Tensor::empty(Shape{n}, d, Device::cpu());
      gpu().scale(x.device, -0.37f, og);
      cpu().scale(x.host, -0.37f, oc);
      const std::vector<float> xv = x.host.to_vector();
      std::vector<double> want(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) want[i] = (double)-0.37f * xv[i];
      check_close(og.to_vector(), want, tolerance_for(d, d, 1));
      require_same_bits(og, oc);

      Tensor s = Tensor::scalar(1.75f, DType::F32, Device::cuda());
      gpu().broadcast_scalar(s, 0.5f, og);
      check_close(og.to_vector(), std::vector<double>(static_cast<size_t>(n), 0.875), tolerance_for(d, d, 1));
    }
}

TEST_CASE("cuda accumulate adds alpha * s[0] * src with s read on the device", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType dst_dtype : {DType::F32, DType::F16})
      for (DType src_dtype : kDtypes)
        for (bool with_s : {false, true}) {
          Pair dst = make_pair(Shape{n}, dst_dtype, 5 + n), src = make_pair(Shape{n}, src_dtype, 6 + n);
          Tensor s = Tensor::scalar(-3.0f, DType::F32, Device::cuda());
          const std::vector<float> d0 = dst.host.to_vector(), sv = src.host.to_vector();
          gpu().accumulate(dst.device, src.device, 0.25f, with_s ? &s : nullptr);
          const double factor = 0.25 * (with_s ? -3.0 : 1.0);
          std::vector<double> want(d0.size()), mag(d0.size());
          for (size_t i = 0; i < d0.size(); ++i) {
            want[i] = d0[i] + factor * sv[i];
            mag[i] = std::fabs(d0[i]) + std::fabs(factor * sv[i]);
          }
          // Three FP32 roundings (factor, product, sum), then one into dst's dtype.
          INFO(name_of(src_dtype) << " into " << name_of(dst_dtype) << ", n = " << n);
          check_close(dst.device.to_vector(), want, tolerance_for(src_dtype, dst_dtype, 3), mag);
        }
}

TEST_CASE("cuda relu and gelu, forward and backward, match FP64", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes) {
      Pair x = make_pair(Shape{n}, d, 7 + n, -4.0f, 4.0f), dy = make_pair(Shape{n}, d, 8 + n);
      const std::vector<float> xv = x.host.to_vector(), gv = dy.host.to_vector();
      Tensor y = Tensor::empty(Shape{n}, d, Device::cuda()), yc = Tensor::empty(Shape{n}, d, Device::cpu());

      gpu().activation(Activation::Relu, x.device, y);
      cpu().activation(Activation::Relu, x.host, yc);
      require_same_bits(y, yc);
      gpu().activation_backward(Activation::Relu, x.device, dy.device, y);
      cpu().activation_backward(Activation::Relu, x.host, dy.host, yc);
      require_same_bits(y, yc);

      std::vector<double> want(xv.size()), mag(xv.size()), dwant(xv.size()), dmag(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        const double v = xv[i], erf_v = std::erf(v / std::sqrt(2.0));
        const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
        want[i] = 0.5 * v * (1.0 + erf_v);
        mag[i] = 0.5 * std::fabs(v) * (1.0 + std::fabs(erf_v));  // what erff's error is relative to
        dwant[i] = gv[i] * (0.5 * (1.0 + erf_v) + v * pdf);
        dmag[i] = std::fabs(gv[i]) * (0.5 * (1.0 + std::fabs(erf_v)) + std::fabs(v) * pdf);
      }
      INFO(name_of(d) << ", n = " << n);
      // gelu: 4 FP32 operations plus erff (CUDA documents <= 2 ulp): 6 roundings' worth.
      gpu().activation(Activation::Gelu, x.device, y);
      check_close(y.to_vector(), want, tolerance_for(d, d, 6), mag);
      // gelu': ~8 operations, erff and expf (<= 2 ulp each), and the exponent's own
      // rounding amplified by x^2/2 <= 8 on [-4, 4]: 20 roundings' worth.
      gpu().activation_backward(Activation::Gelu, x.device, dy.device, y);
      check_close(y.to_vector(), dwant, tolerance_for(d, d, 20), dmag);
    }
}

// GELU's tanh form: the FP32 bound of tests/kernels/gelu_tanh_reference.h with expf's 2 ulp
// (4 u), plus the one rounding into the dtype; dx = dy g rounds once more in FP32.
TEST_CASE("cuda gelu_tanh, forward and backward, matches FP64", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  const double u32 = unit_roundoff(DType::F32);
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes) {
      Pair x = make_pair(Shape{n}, d, 17 + n, -12.0f, 12.0f), dy = make_pair(Shape{n}, d, 18 + n);
      const std::vector<float> xv = x.host.to_vector(), gv = dy.host.to_vector();
      const double ud = unit_roundoff(d) / u32;  // the dtype's rounding in units of u32
      std::vector<double> want(xv.size()), mag(xv.size()), dwant(xv.size()), dmag(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        const test::GeluTanhRef r = test::gelu_tanh_reference(xv[i], 4.0);
        want[i] = r.y;
        mag[i] = r.y_mag + ud * std::fabs(r.y);
        dwant[i] = gv[i] * r.dy;
        dmag[i] = std::fabs(gv[i]) * (r.dy_mag + (1.0 + ud) * std::fabs(r.dy));
      }
      INFO(name_of(d) << ", n = " << n);
      Tensor y = Tensor::empty(Shape{n}, d, Device::cuda());
      gpu().activation(Activation::GeluTanh, x.device, y);
      check_close(y.to_vector(), want, Tolerance{u32, static_cast<double>(finfo(d).smallest_subnormal)}, mag);
      gpu().activation_backward(Activation::GeluTanh, x.device, dy.device, y);
      check_close(y.to_vector(), dwant, Tolerance{u32, static_cast<double>(finfo(d).smallest_subnormal)}, dmag);
    }
}

TEST_CASE("cuda clamp_inplace gives the CPU's bits, NaN kept", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : odd_sizes())
    for (DType d : kDtypes) {
      std::vector<float> v = random_values(n, 9 + n, -3.0f, 3.0f, d);
      v[v.size() / 2] = NAN;
      Pair x = make_pair(v, Shape{n}, d);
      gpu().clamp_inplace(x.device, -1.0f, 0.5f);
      cpu().clamp_inplace(x.host, -1.0f, 0.5f);
      require_same_bits(x.device, x.host);
    }
}

TEST_CASE("cuda division (the scaler's 1/scale) gives the CPU's bits", "[gpu][elementwise]") {
  BELAY_REQUIRE_GPU();
  const std::vector<float> xs{1.0f, 1.0f, 1.0f, 3.0f, -2.5f, 1e-3f}, ys{65536.0f, 3.0f, 7e-5f, 0.7f, 1.1f, 3e4f};
  const Tensor a = Tensor::from_vector(xs, Shape{6}), b = Tensor::from_vector(ys, Shape{6});
  Tensor oc = Tensor::empty(Shape{6});
  cpu().binary(BinaryOp::Div, a, b, oc);
  Tensor og = Tensor::empty(Shape{6}, DType::F32, Device::cuda());
  gpu().binary(BinaryOp::Div, a.to(Device::cuda()), b.to(Device::cuda()), og);
  CHECK(og.to_vector() == oc.to_vector());
}
