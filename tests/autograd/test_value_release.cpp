// An op's result lives while a Var names it or a backward still to run reads it
// (autograd/graph.h): what no backward reads is released during the forward, what one reads
// is released once that backward ran, and none of it changes a gradient's bits (anomaly mode,
// which keeps every value, is the reference).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "autograd/anomaly.h"
#include "autograd/gpt.h"
#include "autograd/modules.h"
#include "engine/allocator.h"
#include "engine/random.h"

using namespace belay;

namespace {

size_t in_use() { return allocator_for(Device::cpu()).stats().bytes_in_use; }

Var leaf(const Shape& s, float v) { return Var(Tensor::full(s, v), true); }

}  // namespace

TEST_CASE("a result no backward reads is released when its last Var goes", "[autograd][memory]") {
  const Var x = leaf(Shape{64, 32}, 0.25f), w = leaf(Shape{16, 32}, 0.5f), z = leaf(Shape{64, 16}, 1.0f);
  const size_t out_bytes = 64 * 16 * sizeof(float);
  SECTION("linear's output feeds only add, whose backward reads nothing: released") {
    const size_t before = in_use();
    const Var y = add(linear(x, w, Var()), z);
    CHECK(in_use() - before == out_bytes);  // y alone
  }
  SECTION("while a Var names it, it stays") {
    const size_t before = in_use();
    const Var h = linear(x, w, Var());
    const Var y = add(h, z);
    CHECK(in_use() - before == 2 * out_bytes);
  }
  SECTION("gelu's backward reads its input: kept until that backward ran, then released") {
    const size_t before = in_use();
    Var y = gelu(linear(x, w, Var()));
    CHECK(in_use() - before == 2 * out_bytes);
    const Var loss = sum(y);
    y = Var();  // only the graph holds gelu's output now; sum's backward does not read it
    const size_t after_forward = in_use();
    CHECK(after_forward - before == out_bytes + sizeof(float));  // linear's output (gelu reads it) and the loss
    loss.backward();
    // What is left: the loss (still named) and the gradients of x and w (z takes no part here).
    // linear's output went with gelu's backward.
    CHECK(in_use() - before == sizeof(float) + 64 * 32 * sizeof(float) + 16 * 32 * sizeof(float));
  }
}

TEST_CASE("releasing values changes no gradient bit of a GPT and lowers its peak", "[autograd][memory][gpt]") {
  GptConfig c;
  c.vocab = 13;
  c.context = 16;
  c.width = 32;
  c.layers = 2;
  c.heads = 4;
  Tensor ids = Tensor::empty(Shape{3, 16}, DType::F32);
  Tensor labels = Tensor::empty(Shape{48}, DType::F32);
  for (int64_t i = 0; i < 48; ++i) {
    ids.data_as<float>()[i] = static_cast<float>((7 * i + 3) % 13);
    labels.data_as<float>()[i] = static_cast<float>((5 * i + 1) % 13);
  }
  auto run = [&](bool keep_every_value, size_t& peak) {
    Rng rng(4);
    Gpt gpt(c, rng);
    CachingAllocator& a = allocator_for(Device::cpu());
    const size_t base = a.stats().bytes_in_use;
    a.reset_peak();
    {
      std::unique_ptr<DetectAnomaly> keep;
      if (keep_every_value) keep = std::make_unique<DetectAnomaly>();
      Var loss = cross_entropy(gpt.forward(Var(ids)), labels);
      loss.backward();
    }
    peak = a.stats().peak_bytes_in_use - base;
    std::vector<std::vector<float>> grads;
    for (auto& [name, p] : gpt.named_parameters()) grads.push_back(p.grad().to_vector());
    return grads;
  };
  size_t peak_released = 0, peak_kept = 0;
  const auto released = run(false, peak_released);
  const auto kept = run(true, peak_kept);
  REQUIRE(released.size() == kept.size());
  for (size_t i = 0; i < kept.size(); ++i) CHECK(released[i] == kept[i]);
  INFO("peak bytes of tensors: released " << peak_released << ", kept " << peak_kept);
  CHECK(peak_released < peak_kept);
}
