// The communicator seam of SafeStep, without MPI: a stand-in for a world of two ranks whose
// peer reports chosen guard values. It checks the wiring (the agreement happens after the
// guard and before the clip coefficient, the step and the scaler update act on it) and that
// agreeing replicas change nothing, bit for bit. tests/dist/dist_test.sh runs real ranks.
#include <catch2/catch.hpp>

#include <cmath>

#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "tests/amp/master_bits.h"

using namespace belay;

namespace {

// Rank 0 of two; the peer's gradients are this rank's (the all-reduce adds them: each rank's
// backward was divided by two, so the sum is one process's gradient), its guard saw `peer_found_inf`, `peer_nonfinite_loss` and `peer_norm` (< 0: the
// same norm as this rank, as agreeing replicas have). Combined as MpiCommunicator does.
class PeerCommunicator final : public Communicator {
 public:
  float peer_found_inf = 0.0f, peer_nonfinite_loss = 0.0f, peer_norm = -1.0f;
  int world_size() const override { return 2; }
  int rank() const override { return 0; }
  std::string name() const override { return "peer"; }
  void all_reduce_gradients(const std::vector<Tensor*>& grads) override {
    const Backend& be = backend_for(Device::cpu());
    for (Tensor* g : grads) be.binary(BinaryOp::Add, *g, *g, *g);  // + the peer's equal share: exact
    ++gradient_syncs_;
  }
  void agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) override {
    float* f = found_inf.data_as<float>();
    float* l = nonfinite_loss.data_as<float>();
    float* n = norm.data_as<float>();
    *f = std::max(*f, peer_found_inf);
    *l = std::max(*l, peer_nonfinite_loss);
    const double mine = *n, theirs = peer_norm < 0.0f ? *n : peer_norm;
    *n = static_cast<float>(std::sqrt((mine * mine + theirs * theirs) / 2.0));
    ++agreements_;
  }
};

struct TwoRunner {
  Rng rng{11};
  Linear model{8, 3, rng};
  AdamW opt{model.parameters()};
  GradScaler scaler{Device::cpu(), GradScalerOptions{}};  // loss scaling on: a skip backs it off
  SafeStep step;
  Tensor x = Tensor::full(Shape{4, 8}, 0.25f), y = Tensor::full(Shape{4, 3}, 1.0f);
  TwoRunner(Communicator* comm, float max_norm)
      : step(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{max_norm, 1, true}, comm) {}
  StepRow run() {
    return step.run([&](int) { return mse_loss(model(Var(x)), y); });
  }
};

}  // namespace

TEST_CASE("agreeing replicas: the agreed norm is each rank's own, the step bit for bit unchanged", "[amp][dist]") {
  for (float max_norm : {INFINITY, 0.01f}) {  // 0.01 clips: the clip coefficient reads the agreed norm
    PeerCommunicator peer;
    TwoRunner local(nullptr, max_norm), two(&peer, max_norm);
    for (int i = 0; i < 4; ++i) {
      const StepRow a = local.run(), b = two.run();
      CHECK(a.grad_l2_pre_clip == b.grad_l2_pre_clip);
      CHECK(a.grad_l2_post_clip == b.grad_l2_post_clip);
      CHECK_FALSE(b.skipped);
    }
    CHECK(test::master_bits(local.model) == test::master_bits(two.model));
    CHECK(peer.agreements() == 4);
  }
}

TEST_CASE("an overflow on the peer alone skips this rank's step and backs its scale off", "[amp][dist]") {
  PeerCommunicator peer;
  TwoRunner two(&peer, INFINITY);
  two.run();
  const std::vector<uint32_t> before = test::master_bits(two.model);
  const float scale = two.scaler.scale();
  peer.peer_found_inf = 1.0f;
  peer.peer_norm = INFINITY;
  const StepRow row = two.run();
  CHECK(row.skipped);
  CHECK(row.skip_reason == "nonfinite_grad");
  CHECK(std::isinf(row.grad_l2_pre_clip));  // the agreed norm, not this rank's finite one
  CHECK(test::master_bits(two.model) == before);
  CHECK(two.scaler.scale() == scale * 0.5f);
  CHECK(two.opt.step_count() == 1);  // the LR schedule and bias corrections did not advance
}

TEST_CASE("a non-finite loss on the peer alone is this rank's skip reason too", "[amp][dist]") {
  PeerCommunicator peer;
  TwoRunner two(&peer, INFINITY);
  peer.peer_found_inf = 1.0f;  // the peer's guard folds its loss flag into found_inf
  peer.peer_nonfinite_loss = 1.0f;
  const StepRow row = two.run();
  CHECK(row.skipped);
  CHECK(row.skip_reason == "nonfinite_loss");
}

TEST_CASE("the unfused step is refused with more than one rank", "[amp][dist]") {
  Rng rng{1};
  Linear model{2, 2, rng};
  AdamW opt{model.parameters()};
  GradScaler scaler{Device::cpu(), GradScalerOptions{}};
  PeerCommunicator peer;
  CHECK_THROWS_AS(SafeStep(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{INFINITY, 1, false}, &peer),
                  UsageError);
}
