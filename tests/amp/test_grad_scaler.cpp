// GradScaler: the dynamic loss scale's transitions and the per-optimizer state machine.
#include <catch2/catch.hpp>

#include <cmath>

#include "amp/grad_scaler.h"
#include "engine/error.h"
#include "optim/sgd.h"

using namespace belay;

namespace {

// A one-parameter optimizer whose gradient we set by hand.
struct Fixture {
  Var w = Var::parameter(Tensor::from_vector({1.0f, -2.0f}, Shape{2}), "w");
  Sgd opt{{w}, SgdOptions{0.1f, 0.0f, 0.0f}};
  void set_grad(float a, float b) { w.mutable_grad() = Tensor::from_vector({a, b}, Shape{2}); }
};

// One full step of the scaler with the given gradient (fused path).
void scaler_step(GradScaler& s, Fixture& f, float g) {
  f.set_grad(g, g);
  s.guard(f.opt, INFINITY);
  s.step(f.opt);
  s.update();
}

}  // namespace

TEST_CASE("scaler defaults are PyTorch's", "[amp][scaler]") {
  GradScalerOptions o;
  CHECK(o.init_scale == 65536.0f);
  CHECK(o.growth_factor == 2.0f);
  CHECK(o.backoff_factor == 0.5f);
  CHECK(o.growth_interval == 2000);
  CHECK(default_scaler_enabled(DType::F16));
  CHECK_FALSE(default_scaler_enabled(DType::BF16));
  CHECK_FALSE(default_scaler_enabled(DType::F32));
}

TEST_CASE("the scale grows after exactly growth_interval clean steps", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 1024.0f;
  o.growth_interval = 3;
  GradScaler s(Device::cpu(), o);
  scaler_step(s, f, 1.0f);
  scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 1024.0f);
  scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 2048.0f);
  CHECK(s.state().growth_tracker == 0.0f);
  scaler_step(s, f, 1.0f);
  scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 2048.0f);
}

TEST_CASE("an overflow backs the scale off and resets the growth count", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 1024.0f;
  o.growth_interval = 3;
  GradScaler s(Device::cpu(), o);
  scaler_step(s, f, 1.0f);
  scaler_step(s, f, 1.0f);
  scaler_step(s, f, INFINITY);
  CHECK(s.scale() == 512.0f);
  CHECK(s.state().growth_tracker == 0.0f);
  scaler_step(s, f, NAN);
  CHECK(s.scale() == 256.0f);
  scaler_step(s, f, 1.0f);
  scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 256.0f);  // only 2 clean steps since the overflow
  scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 512.0f);
}

TEST_CASE("hysteresis backs off only after N overflows", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 1024.0f;
  o.hysteresis = 3;
  o.growth_interval = 100;
  GradScaler s(Device::cpu(), o);
  scaler_step(s, f, INFINITY);
  scaler_step(s, f, INFINITY);
  CHECK(s.scale() == 1024.0f);
  scaler_step(s, f, INFINITY);
  CHECK(s.scale() == 512.0f);
  // Used up: every further overflow backs off until a growth refills the tracker (Megatron).
  scaler_step(s, f, INFINITY);
  CHECK(s.scale() == 256.0f);
}

TEST_CASE("the scale stays within min and max", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 4.0f;
  o.min_scale = 2.0f;
  o.max_scale = 8.0f;
  o.growth_interval = 1;
  GradScaler s(Device::cpu(), o);
  scaler_step(s, f, INFINITY);
  scaler_step(s, f, INFINITY);
  scaler_step(s, f, INFINITY);
  CHECK(s.scale() == 2.0f);
  for (int i = 0; i < 5; ++i) scaler_step(s, f, 1.0f);
  CHECK(s.scale() == 8.0f);
}

TEST_CASE("growth never overflows FP32", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 0x1p127f;
  o.max_scale = INFINITY;
  o.growth_interval = 1;
  GradScaler s(Device::cpu(), o);
  scaler_step(s, f, 1e-30f);
  CHECK(std::isfinite(s.scale()));
  CHECK(s.scale() == 0x1p127f);
}

TEST_CASE("scaler state saves and restores", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.init_scale = 1024.0f;
  o.growth_interval = 5;
  o.hysteresis = 2;
  GradScaler a(Device::cpu(), o);
  scaler_step(a, f, 1.0f);
  scaler_step(a, f, 1.0f);
  scaler_step(a, f, INFINITY);
  scaler_step(a, f, 1.0f);
  const ScalerState st = a.state();
  CHECK(st.scale == 1024.0f);
  CHECK(st.growth_tracker == 1.0f);
  CHECK(st.hysteresis_left == 1.0f);
  GradScaler b(Device::cpu(), o);
  b.load_state(st);
  // Both now evolve identically.
  for (float g : {1.0f, INFINITY, 1.0f, 1.0f}) {
    scaler_step(a, f, g);
    scaler_step(b, f, g);
    CHECK(a.state().scale == b.state().scale);
    CHECK(a.state().growth_tracker == b.state().growth_tracker);
    CHECK(a.state().hysteresis_left == b.state().hysteresis_left);
  }
  CHECK_THROWS_AS(b.load_state({-1.0f, 0.0f, 1.0f}), Error);
}

TEST_CASE("a disabled scaler keeps scale 1 and still reports overflows", "[amp][scaler]") {
  Fixture f;
  GradScalerOptions o;
  o.enabled = false;
  GradScaler s(Device::cpu(), o);
  CHECK(s.loss_seed() == 1.0f);
  f.set_grad(INFINITY, 1.0f);
  s.guard(f.opt, INFINITY);
  CHECK(s.found_inf(f.opt));
  s.step(f.opt);
  s.update();
  CHECK(s.scale() == 1.0f);
}

TEST_CASE("misuse of the scaler is a clear error", "[amp][scaler]") {
  Fixture f;
  GradScaler s(Device::cpu());
  f.set_grad(1.0f, 1.0f);
  SECTION("step without the finite check") {
    CHECK_THROWS_WITH(s.step(f.opt), Catch::Contains("without the finite check"));
  }
  SECTION("unscale twice before update") {
    s.unscale_(f.opt);
    CHECK_THROWS_WITH(s.unscale_(f.opt), Catch::Contains("already been called"));
  }
  SECTION("guard after unscale") {
    s.unscale_(f.opt);
    CHECK_THROWS_AS(s.guard(f.opt, 1.0f), Error);
  }
  SECTION("step twice") {
    s.unscale_(f.opt);
    s.step(f.opt);
    CHECK_THROWS_WITH(s.step(f.opt), Catch::Contains("already been called"));
  }
  SECTION("unscale after step") {
    s.unscale_(f.opt);
    s.step(f.opt);
    CHECK_THROWS_WITH(s.unscale_(f.opt), Catch::Contains("after step"));
  }
  SECTION("update with nothing checked") { CHECK_THROWS_AS(s.update(), Error); }
  SECTION("update before step") {
    s.unscale_(f.opt);
    CHECK_THROWS_WITH(s.update(), Catch::Contains("before step"));
  }
  SECTION("a full cycle resets the machine") {
    s.unscale_(f.opt);
    s.step(f.opt);
    s.update();
    f.set_grad(1.0f, 1.0f);
    CHECK_NOTHROW(s.unscale_(f.opt));
  }
}

TEST_CASE("bad scaler settings are usage errors", "[amp][scaler]") {
  auto with = [](auto change) {
    GradScalerOptions o;
    change(o);
    return o;
  };
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.init_scale = 0; })), UsageError);
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.growth_factor = 1.0f; })), UsageError);
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.backoff_factor = 1.0f; })), UsageError);
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.growth_interval = 0; })), UsageError);
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.hysteresis = 0; })), UsageError);
  CHECK_THROWS_AS(GradScaler(Device::cpu(), with([](auto& o) { o.min_scale = 16; o.max_scale = 8; })), UsageError);
}
