// backward's leaf hook: every parameter reported once, when its gradient is final, the last
// layer first (what lets data parallelism start a bucket's all-reduce during backward).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "autograd/modules.h"
#include "engine/backend.h"

using namespace belay;

TEST_CASE("backward reports each leaf once, with its final gradient, output layer first", "[autograd][dist]") {
  Rng rng{3};
  Mlp mlp(6, 8, 2, rng, 3);
  Tensor x = Tensor::full(Shape{4, 6}, 0.5f), y = Tensor::full(Shape{4, 2}, 1.0f);
  Var xv(x, true);  // an input that requires grad: a leaf the hook reports too
  Var loss = mse_loss(mlp(xv), y);
  std::vector<Node*> order;
  std::map<Node*, std::vector<float>> at_hook;
  loss.backward(Tensor::full(Shape{1}, 1.0f), 1.0f, [&](Node& leaf) {
    order.push_back(&leaf);
    at_hook[&leaf] = leaf.grad.to_vector();
  });
  const auto params = mlp.named_parameters();
  CHECK(order.size() == params.size() + 1);
  CHECK(at_hook.size() == order.size());  // once each
  for (const auto& [name, p] : params) {
    INFO(name);
    REQUIRE(at_hook.count(p.node()));
    CHECK(at_hook[p.node()] == p.grad().to_vector());  // nothing was added after the report
  }
  CHECK(at_hook[xv.node()] == xv.grad().to_vector());
  // The last layer's parameters are done before the first layer's; the input is done with the
  // first layer (the op that reads both reports them together), after every later layer.
  auto position = [&](const Var& v) { return std::find(order.begin(), order.end(), v.node()) - order.begin(); };
  CHECK(position(params.back().second) < position(params.front().second));
  for (size_t i = 2; i < params.size(); ++i) CHECK(position(params[i].second) < position(xv));
}

TEST_CASE("backward without a hook gives the same gradients as with one", "[autograd][dist]") {
  std::vector<std::vector<float>> grads[2];
  for (int hooked = 0; hooked < 2; ++hooked) {
    Rng rng{5};
    Mlp mlp(5, 7, 3, rng, 2);
    Var loss = mse_loss(mlp(Var(Tensor::full(Shape{3, 5}, 0.25f))), Tensor::full(Shape{3, 3}, 2.0f));
    if (hooked)
      loss.backward(Tensor::full(Shape{1}, 1.0f), 1.0f, [](Node&) {});
    else
      loss.backward(Tensor::full(Shape{1}, 1.0f), 1.0f);
    for (const Var& p : mlp.parameters()) grads[hooked].push_back(p.grad().to_vector());
  }
  CHECK(grads[0] == grads[1]);
}
