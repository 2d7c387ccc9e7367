// The CUDA guard's census (engine/census.h) against the plain reference of
// tests/kernels/census_case.h, on the same tensors as the CPU paths' test: every count, the
// amax's bits, many tensors per launch (more than one batch), and the guard's own outputs
// unchanged by it. The planted bug "census_lane" (tests/emulation/plant.py) is caught here.
#include <cstring>

#include "engine/census.h"
#include "tests/amp/two_layers.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/census_case.h"

using namespace belay;
using namespace belay::test;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST_CASE("cuda guard census: every count against the reference and the outputs unchanged", "[gpu][amp][census]") {
  BELAY_REQUIRE_GPU();
  for (const DType format : {DType::F16, DType::BF16})
    for (const DType grad_dtype : {DType::F32, DType::F16, DType::BF16}) {
      INFO("census in " << dtype_name(format) << ", gradients " << dtype_name(grad_dtype));
      // 12 copies of the three tensors: 36 gradients, two launches of the partials kernel.
      std::vector<Tensor> ts;
      for (uint64_t rep = 0; rep < 12; ++rep)
        for (Tensor& t : census_tensors(format, grad_dtype, 1024.0f, 11 + rep, Device::cuda())) ts.push_back(t);
      std::vector<const Tensor*> grads;
      for (const Tensor& t : ts) grads.push_back(&t);
      const Tensor inv = Tensor::scalar(1.0f / 1024.0f, DType::F32, Device::cuda());
      Tensor f = Tensor::empty(Shape{1}, DType::F32, Device::cuda()), n = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
      Tensor f0 = Tensor::empty(Shape{1}, DType::F32, Device::cuda()), n0 = Tensor::empty(Shape{1}, DType::F32, Device::cuda());
      Tensor census = Tensor::empty(Shape{static_cast<int64_t>(grads.size()), kCensusFields}, DType::F32, Device::cuda());
      gpu().guard(grads, inv, f, n, GuardCensus{&census, format});
      gpu().guard(grads, inv, f0, n0);
      CHECK(bits(f.item()) == bits(f0.item()));
      CHECK(bits(n.item()) == bits(n0.item()));
      const Tensor host = census.to(Device::cpu());
      const uint32_t* w = host.data_as<const uint32_t>();
      for (size_t t = 0; t < ts.size(); ++t) {
        INFO("tensor " << t << " of " << ts[t].numel() << " elements");
        const TensorCensus want = census_reference(ts[t], format);
        CHECK(record_differences(w + t * kCensusFields, want).empty());
      }
    }
}

TEST_CASE("cuda cast census: every count against the reference and the cast's bits as the CPU's", "[gpu][amp][census]") {
  BELAY_REQUIRE_GPU();
  for (const DType format : {DType::F16, DType::BF16}) {
    INFO("cast to " << dtype_name(format));
    // Two calls into one record: 300 blocks' worth, then a short one.
    std::vector<float> a = cast_census_values(format, 5);
    for (uint64_t rep = 0; rep < 32; ++rep) {
      const std::vector<float> more = cast_census_values(format, 6 + rep);
      a.insert(a.end(), more.begin(), more.end());
    }
    const std::vector<float> b(a.begin(), a.begin() + 37);
    Tensor record = Tensor::zeros(Shape{kCensusFields}, DType::F32, Device::cuda());
    for (const std::vector<float>* v : {static_cast<const std::vector<float>*>(&a), &b}) {
      const Tensor x = Tensor::from_vector(*v, Shape{static_cast<int64_t>(v->size())});
      Tensor out = Tensor::empty(x.shape(), format, Device::cuda());
      gpu().cast_census(x.to(Device::cuda()), out, record);
      const Tensor host = out.to(Device::cpu()), want = x.to(format);
      CHECK(std::memcmp(host.data(), want.data(), want.nbytes()) == 0);
    }
    std::vector<float> both = a;
    both.insert(both.end(), b.begin(), b.end());
    const TensorCensus want = cast_census_reference(both, format);
    const Tensor host = record.to(Device::cpu());
    CHECK(record_differences(host.data_as<const uint32_t>(), want).empty());
  }
}

TEST_CASE("cuda cast census: a step that takes it keeps every bit, fp16 gradient buffers included", "[gpu][amp][census]") {
  BELAY_REQUIRE_GPU();
  // The CUDA products write FP32 and the counted cast rounds them where, without the census,
  // they round into the FP16 buffer themselves: the same bits, and two micro-batches add alike.
  for (const DType grads : {DType::F32, DType::F16}) {
    INFO("gradients " << dtype_name(grads));
    TwoLayers with(DType::F16, grads, 2, true, 1.0f, 1024.0f, Device::cuda());
    TwoLayers without(DType::F16, grads, 2, false, 1.0f, 1024.0f, Device::cuda());
    for (int s = 0; s < 2; ++s) {
      const StepRow a = with.run(), b = without.run();
      CHECK(bits(a.loss) == bits(b.loss));
      CHECK(bits(a.grad_l2_pre_clip) == bits(b.grad_l2_pre_clip));
      CHECK(!a.cast_census.empty());
    }
    CHECK(with.state_bits() == without.state_bits());
  }
}
