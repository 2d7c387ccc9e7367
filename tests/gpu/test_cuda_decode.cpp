// Incremental decoding (autograd/gpt_decode.h) on the CUDA backend: the cache is written and
// read with the device's own copies, and the logits of a prompt then one token at a time are
// those of forward's last row on the device, bit for bit, in FP32 and under FP16 / BF16
// autocast. Small: the emulator runs every thread as a fiber.
#include <cstring>

#include "amp/autocast.h"
#include "autograd/gpt_decode.h"
#include "autograd/graph.h"
#include "engine/random.h"
#include "tests/gpu/gpu_test_util.h"

using namespace belay;

TEST_CASE("cuda gpt decode: a prompt then one token at a time gives forward's last rows", "[gpu][decode]") {
  BELAY_REQUIRE_GPU();
  GptConfig c;
  c.vocab = 11;
  c.context = 6;
  c.width = 16;
  c.layers = 1;
  c.heads = 2;
  const std::vector<float> seq{3, 1, 4, 1, 5, 9};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    Rng init(5);
    Gpt gpt(c, init, Device::cuda());
    gpt.set_working_dtype(dtype);
    NoGrad no_grad;
    Autocast autocast(dtype, dtype != DType::F32);
    KvCache cache(c, 1);
    for (int64_t n = 3; n <= c.context; ++n) {
      INFO(dtype_name(dtype) << ", positions " << n);
      const int64_t begin = n == 3 ? 0 : n - 1;
      const Tensor fresh = Tensor::from_vector({seq.begin() + begin, seq.begin() + n}, Shape{1, n - begin}, DType::F32,
                                               Device::cuda());
      const Tensor all = Tensor::from_vector({seq.begin(), seq.begin() + n}, Shape{1, n}, DType::F32, Device::cuda());
      const std::vector<float> got = gpt.forward_cached(Var(fresh), cache).value().to(Device::cpu()).to_vector();
      const std::vector<float> full = gpt.forward(Var(all)).value().to(Device::cpu()).to_vector();
      const std::vector<float> want(full.end() - c.vocab, full.end());
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
    CHECK(cache.layers[0].k.device().is_cuda());
    CHECK(cache.layers[0].k.dtype() == dtype);
  }
}
