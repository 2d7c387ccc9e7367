// Parameter groups in AdamW and SGD: a group is updated exactly as an optimizer of its own
// with the group's options would update it (those are checked against the reference
// sequences in test_optim.cpp), a schedule scales each group's lr by group lr / optimizer
// lr, and a checkpoint of a grouped optimizer resumes bit for bit.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "amp/checkpoint.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "engine/random.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tests/files.h"

using namespace belay;

namespace {

std::vector<float> values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-2.0f, 2.0f);
  return v;
}

// Step t's gradient of a parameter: a fixed sequence, the same for every copy of a model.
void set_grads(const std::vector<Var>& params, int t) {
  for (size_t k = 0; k < params.size(); ++k) {
    Var p = params[k];
    p.mutable_grad() = Tensor::from_vector(values(static_cast<size_t>(p.shape().numel()), 100 + 10 * t + k), p.shape());
  }
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float x : t.to_vector()) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    out.push_back(u);
  }
  return out;
}

// A Linear(3, 2): weight [2, 3], bias [2]; the same initial weights for every seed given.
struct Model {
  Rng rng;
  Linear lin;
  explicit Model(uint64_t seed) : rng(seed), lin(3, 2, rng) {}
};

AdamWOptions adamw_options(float lr, float b1, float b2, float eps, float wd, bool decay_1d) {
  AdamWOptions o;
  o.lr = lr;
  o.beta1 = b1;
  o.beta2 = b2;
  o.eps = eps;
  o.weight_decay = wd;
  o.decay_1d = decay_1d;
  return o;
}

}  // namespace

TEST_CASE("AdamW groups: each group updated as its own optimizer with its options, bit for bit", "[optim][groups]") {
  const AdamWOptions defaults = adamw_options(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, false);
  const AdamWOptions bias_options = adamw_options(0.05f, 0.8f, 0.99f, 1e-6f, 0.2f, true);  // decayed though 1-D
  Model grouped(1), alone(1);
  AdamW opt({{{grouped.lin.weight}, defaults}, {{grouped.lin.bias}, bias_options}}, defaults);
  AdamW weight_opt({alone.lin.weight}, defaults);
  AdamW bias_opt({alone.lin.bias}, bias_options);
  REQUIRE(opt.group_count() == 2);
  CHECK(opt.group_lr_ratio(0) == 1.0);
  for (int t = 1; t <= 5; ++t) {
    set_grads({grouped.lin.weight, grouped.lin.bias}, t);
    set_grads({alone.lin.weight, alone.lin.bias}, t);
    opt.step();
    weight_opt.step();
    bias_opt.step();
  }
  CHECK(bits(grouped.lin.weight.master()) == bits(alone.lin.weight.master()));
  CHECK(bits(grouped.lin.bias.master()) == bits(alone.lin.bias.master()));
  CHECK(bits(opt.exp_avg_sq(1)) == bits(bias_opt.exp_avg_sq(0)));
  CHECK(opt.lr_tensor(1).item() == 0.05f);
  CHECK(opt.lr_tensor().item() == 0.01f);  // the log's LR: the optimizer's own
  // The bias moved at all (its group's decay and lr were not the defaults' 0 and 0.01).
  CHECK(bits(grouped.lin.bias.master()) != bits(Model(1).lin.bias.master()));
}

TEST_CASE("SGD groups: per-group lr, momentum (none: no buffer) and weight decay, bit for bit", "[optim][groups]") {
  const SgdOptions defaults{0.1f, 0.9f, 0.01f, false};
  const SgdOptions bias_options{0.02f, 0.0f, 0.5f, true};
  Model grouped(2), alone(2);
  Sgd opt({{{grouped.lin.weight}, defaults}, {{grouped.lin.bias}, bias_options}}, defaults);
  Sgd weight_opt({alone.lin.weight}, defaults);
  Sgd bias_opt({alone.lin.bias}, bias_options);
  for (int t = 1; t <= 4; ++t) {
    set_grads({grouped.lin.weight, grouped.lin.bias}, t);
    set_grads({alone.lin.weight, alone.lin.bias}, t);
    opt.step();
    weight_opt.step();
    bias_opt.step();
  }
  CHECK(bits(grouped.lin.weight.master()) == bits(alone.lin.weight.master()));
  CHECK(bits(grouped.lin.bias.master()) == bits(alone.lin.bias.master()));
  const auto state = opt.state_tensors();
  REQUIRE(state.size() == 1);  // the bias group has no momentum buffer
  CHECK(state[0].first == "optim.weight.momentum_buffer");
}

TEST_CASE("a schedule scales each group's lr by group lr / optimizer lr, a skipped step moves none", "[optim][groups]") {
  const AdamWOptions defaults = adamw_options(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, false);
  AdamWOptions slow = defaults;
  slow.lr = 0.003f;
  Model m(3);
  AdamW opt({{{m.lin.weight}, defaults}, {{m.lin.bias}, slow}}, defaults);
  const LrSchedule s = LrSchedule::warmup_cosine(0.02f, 3, 10, 1e-4f);
  opt.set_schedule(s);
  CHECK(opt.group_lr_ratio(1) == static_cast<double>(0.003f) / static_cast<double>(0.01f));
  const Tensor one = Tensor::scalar(1.0f);
  for (int t = 0; t < 12; ++t) {
    set_grads({m.lin.weight, m.lin.bias}, t);
    const bool skip = t == 4;
    const Tensor bias_before = m.lin.bias.master().clone();
    opt.step(one, one, Tensor::scalar(skip ? 1.0f : 0.0f));
    const int64_t k = t < 4 ? t : (t == 4 ? 4 : t - 1);  // the applied steps before this one
    CHECK(opt.lr_tensor().item() == s.lr_at(k));
    CHECK(opt.lr_tensor(0).item() == s.lr_at(k));
    CHECK(opt.lr_tensor(1).item() == static_cast<float>(static_cast<double>(s.lr_at(k)) * opt.group_lr_ratio(1)));
    if (skip) CHECK(bits(m.lin.bias.master()) == bits(bias_before));
  }
  CHECK(opt.step_count() == 11);
  opt.set_lr(0.5f);  // a constant LR: each group keeps its ratio
  opt.step();
  CHECK(opt.lr_tensor(1).item() == static_cast<float>(0.5 * opt.group_lr_ratio(1)));
  CHECK(opt.lr_tensor(0).item() == 0.5f);
}

TEST_CASE("a grouped optimizer's checkpoint resumes bit for bit", "[optim][groups][checkpoint]") {
  const std::string path = test::temp_path("param_groups", "resume.safetensors");
  const AdamWOptions defaults = adamw_options(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, false);
  const AdamWOptions bias_options = adamw_options(0.05f, 0.5f, 0.9f, 1e-6f, 0.2f, true);
  auto make = [&](Model& m) {
    return std::make_unique<AdamW>(std::vector<AdamWGroup>{{{m.lin.weight}, defaults}, {{m.lin.bias}, bias_options}},
                                   defaults);
  };
  auto train = [](Model& m, AdamW& opt, int from, int to) {
    for (int t = from; t < to; ++t) {
      set_grads({m.lin.weight, m.lin.bias}, t);
      opt.step();
    }
  };
  Model whole(4), first(4), second(77);  // second: other weights, all must come from the file
  auto whole_opt = make(whole), first_opt = make(first), second_opt = make(second);
  train(whole, *whole_opt, 0, 8);
  train(first, *first_opt, 0, 4);
  RunState st;
  st.optimizer_steps = first_opt->step_count();
  save_checkpoint(path, first.lin, *first_opt, st);
  load_checkpoint(path, second.lin, *second_opt, {});
  train(second, *second_opt, 4, 8);
  CHECK(bits(second.lin.weight.master()) == bits(whole.lin.weight.master()));
  CHECK(bits(second.lin.bias.master()) == bits(whole.lin.bias.master()));
  CHECK(bits(second_opt->exp_avg(1)) == bits(whole_opt->exp_avg(1)));
  CHECK(second_opt->step_count() == 8);
  std::remove(path.c_str());
}

TEST_CASE("bad parameter groups are UsageErrors that say what to change", "[optim][groups]") {
  Model m(5);
  const AdamWOptions d = adamw_options(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, false);
  CHECK_THROWS_WITH(AdamW({{{m.lin.weight}, d}, {{}, d}}, d), Catch::Contains("parameter group 1 has no parameters"));
  CHECK_THROWS_WITH(AdamW({{{m.lin.weight}, d}, {{m.lin.weight, m.lin.bias}, d}}, d),
                    Catch::Contains("'weight' is listed twice"));
  AdamWOptions zero = d;
  zero.lr = 0.0f;
  CHECK_THROWS_WITH(AdamW({{{m.lin.weight}, d}}, zero), Catch::Contains("give the optimizer an lr > 0"));
  AdamWOptions bad = d;
  bad.beta1 = 1.0f;
  CHECK_THROWS_AS(AdamW({{{m.lin.weight}, d}, {{m.lin.bias}, bad}}, d), UsageError);
  bad = d;
  bad.lr = -1.0f;
  CHECK_THROWS_WITH(AdamW({{{m.lin.weight}, d}, {{m.lin.bias}, bad}}, d),
                    Catch::Contains("lr must be a finite number >= 0"));
  SgdOptions sbad{0.1f, -1.0f, 0.0f, false};
  CHECK_THROWS_AS(Sgd({{{m.lin.weight}, SgdOptions{}}, {{m.lin.bias}, sbad}}, SgdOptions{}), UsageError);
}
