// The GPT module (autograd/gpt.h): its state dict, GPT-2's initialisation, causality, the
// dtypes of its parts under autocast, and its refusals. Its gradients: test_gradcheck.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "autograd/gpt.h"
#include "engine/error.h"
#include "engine/random.h"

using namespace belay;

namespace {

GptConfig small_config() {
  GptConfig c;
  c.vocab = 11;
  c.context = 8;
  c.width = 16;
  c.layers = 2;
  c.heads = 4;
  return c;
}

double std_of(const std::vector<float>& v) {
  double s = 0.0, s2 = 0.0;
  for (float x : v) s += x, s2 += static_cast<double>(x) * x;
  const double n = static_cast<double>(v.size()), m = s / n;
  return std::sqrt(s2 / n - m * m);
}

}  // namespace

TEST_CASE("gpt: the state dict names every parameter once, the head is tied to wte", "[autograd][gpt]") {
  Rng rng(1);
  const GptConfig c = small_config();
  Gpt gpt(c, rng);
  const auto named = gpt.named_parameters();
  std::set<std::string> names;
  for (auto& [name, p] : named) {
    CHECK(names.insert(name).second);  // unique
    CHECK(p.name() == name);
  }
  CHECK(static_cast<double>(gpt.parameter_count()) == c.parameter_count());
  CHECK(names.count("wte.weight") == 1);
  CHECK(names.count("wpe.weight") == 1);
  CHECK(names.count("blocks.1.attn.q.weight") == 1);
  CHECK(names.count("blocks.1.mlp.proj.bias") == 1);
  CHECK(names.count("ln_f.weight") == 1);
  CHECK(named.size() == 2 + 2 * 16 + 2);  // wte, wpe; per block 2 LayerNorms + 6 Linears, 2 tensors each; ln_f
  for (auto& [name, p] : named) CHECK(name.find("head") == std::string::npos);
}

TEST_CASE("gpt: GPT-2's initialisation", "[autograd][gpt]") {
  GptConfig c = small_config();
  c.width = 64;
  c.vocab = 256;
  c.layers = 8;
  Rng rng(2);
  Gpt gpt(c, rng);
  const double proj_std = 0.02 / std::sqrt(2.0 * 8.0);
  for (auto& [name, p] : gpt.named_parameters()) {
    INFO(name);
    const std::vector<float> v = p.master().to_vector();
    const bool weight = name.size() > 6 && name.substr(name.size() - 6) == "weight";
    if (name.rfind("ln_", 0) == 0 || name.find(".ln_") != std::string::npos) {
      for (float x : v) REQUIRE(x == (weight ? 1.0f : 0.0f));
    } else if (!weight) {
      for (float x : v) REQUIRE(x == 0.0f);  // Linear biases
    } else {
      const bool proj = name.find(".proj.") != std::string::npos;
      // The sample's std: >= 4096 draws, so within 10% of the population's with room to spare.
      CHECK(std::fabs(std_of(v) / (proj ? proj_std : 0.02) - 1.0) < 0.1);
    }
  }
}

TEST_CASE("gpt: a position never sees a later token (the causal mask), bit for bit", "[autograd][gpt]") {
  Rng rng(3);
  const GptConfig c = small_config();
  Gpt gpt(c, rng);
  NoGrad no_grad;
  const Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{1, 6});
  const Tensor b = Tensor::from_vector({1, 2, 3, 9, 0, 10}, Shape{1, 6});  // the same first 3 tokens
  const std::vector<float> la = gpt(Var(a)).value().to_vector(), lb = gpt(Var(b)).value().to_vector();
  REQUIRE(la.size() == static_cast<size_t>(6 * c.vocab));
  for (int64_t i = 0; i < 3 * c.vocab; ++i) CHECK(la[i] == lb[i]);
  bool later_differs = false;
  for (int64_t i = 3 * c.vocab; i < 6 * c.vocab; ++i) later_differs |= la[i] != lb[i];
  CHECK(later_differs);  // the check above is not vacuous: later positions do see their tokens
}

TEST_CASE("gpt: under bf16 the products run in bf16, embeddings and LayerNorms stay fp32", "[autograd][gpt][autocast]") {
  Rng rng(4);
  Gpt gpt(small_config(), rng);
  gpt.set_working_dtype(DType::BF16);
  for (auto& [name, p] : gpt.named_parameters()) {
    INFO(name);
    const bool linear = name.find(".attn.") != std::string::npos || name.find(".mlp.") != std::string::npos;
    CHECK(p.value().dtype() == (linear ? DType::BF16 : DType::F32));
  }
  Autocast autocast(DType::BF16);
  const Tensor ids = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, Shape{2, 4});
  const Var logits = gpt(Var(ids));
  CHECK(logits.dtype() == DType::BF16);  // the tied head is a product
  CHECK(logits.shape() == Shape{8, 11});
  const Var loss = cross_entropy(logits, Tensor::from_vector({2, 3, 4, 5, 6, 7, 8, 9}, Shape{8}));
  CHECK(std::isfinite(loss.value().item()));
  CHECK(std::fabs(loss.value().item() - std::log(11.0)) < 0.1);  // GPT-2's small init: near uniform
}

TEST_CASE("gpt: bad sizes and inputs are refused with a UsageError", "[autograd][gpt]") {
  Rng rng(5);
  GptConfig c = small_config();
  c.heads = 3;  // 16 is not a multiple of 3
  CHECK_THROWS_AS(Gpt(c, rng), UsageError);
  c = small_config();
  c.layers = 0;
  CHECK_THROWS_AS(Gpt(c, rng), UsageError);
  Gpt gpt(small_config(), rng);
  CHECK_THROWS_AS(gpt(Var(Tensor::from_vector({1, 2}, Shape{2}))), UsageError);                // not [B, T]
  CHECK_THROWS_AS(gpt(Var(Tensor::zeros(Shape{1, 9}, DType::F32, Device::cpu()))), UsageError);  // T > context
  CHECK_THROWS_AS(gpt(Var(Tensor::from_vector({1, 11}, Shape{1, 2}))), Error);                  // id >= vocab
}
