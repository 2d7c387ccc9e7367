// The model-kind table (apps/run/model_kinds.h): every kind's shape written into a
// checkpoint's settings reads back as the same shape and builds the same model; an option of
// another kind is refused naming both; a kind's defaults fill only what the user left out.
#include <catch2/catch.hpp>

#include "apps/run/model_kinds.h"
#include "apps/run/train.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "engine/random.h"

using namespace belay;

namespace {

// A config of `kind` whose every size differs from the defaults and from each other.
TrainConfig distinct_shape(const ModelKind& kind) {
  TrainConfig c;
  c.model = kind.name;
  c.in_features = 6;
  c.out_features = 40;
  c.hidden = 12;
  c.layers = 3;
  c.width = 16;
  c.heads = 2;
  c.context = 5;
  c.gelu = "tanh";
  return c;
}

}  // namespace

TEST_CASE("model kinds: the shape a checkpoint records reads back, for every kind", "[apps][model_kinds]") {
  REQUIRE(model_kinds().size() >= 3);
  for (const ModelKind& kind : model_kinds()) {
    INFO(kind.name);
    const TrainConfig written = distinct_shape(kind);
    Settings s;
    write_model_settings(written, s);
    CHECK(s.at("model") == kind.name);
    CHECK(s.at("in") == "6");
    CHECK(s.at("out") == "40");
    for (const ShapeField& f : kind.shape) CHECK(s.at(f.name) == std::to_string(f.get(written)));
    TrainConfig read;  // the defaults, overwritten by what the settings say
    read_model_settings(s, "ck.safetensors", read);
    CHECK(read.model == written.model);
    CHECK(read.in_features == written.in_features);
    CHECK(read.out_features == written.out_features);
    for (const ShapeField& f : kind.shape) CHECK(f.get(read) == f.get(written));
    if (takes_option(kind, "gelu")) {
      CHECK(s.at("gelu") == "tanh");
      CHECK(read.gelu == "tanh");
      Settings before = s;  // a checkpoint from before the tanh form: the erf one
      before.erase("gelu");
      TrainConfig old;
      read_model_settings(before, "ck.safetensors", old);
      CHECK(old.gelu == "erf");
    } else {
      CHECK(s.count("gelu") == 0);
    }
    // The same model from either config: the same parameter count and the same weights.
    Rng r1(3), r2(3);
    const auto a = make_model(written, r1, Device::cpu()), b = make_model(read, r2, Device::cpu());
    CHECK(static_cast<double>(a->parameter_count()) == parameter_count_of(written));
    REQUIRE(a->parameters().size() == b->parameters().size());
    for (size_t i = 0; i < a->parameters().size(); ++i)
      CHECK(a->parameters()[i].master().to_vector() == b->parameters()[i].master().to_vector());
  }
}

TEST_CASE("model kinds: missing or bad settings are refused naming the file and the key", "[apps][model_kinds]") {
  TrainConfig c;
  Settings s;
  write_model_settings(distinct_shape(model_kind("gpt")), s);
  Settings no_width = s;
  no_width.erase("width");
  CHECK_THROWS_WITH(read_model_settings(no_width, "g.safetensors", c),
                    Catch::Contains("checkpoint 'g.safetensors' records no valid width"));
  Settings bad = s;
  bad["heads"] = "2x";
  CHECK_THROWS_AS(read_model_settings(bad, "g.safetensors", c), UsageError);
  bad["heads"] = "0";
  CHECK_THROWS_AS(read_model_settings(bad, "g.safetensors", c), UsageError);
  Settings unknown = s;
  unknown["model"] = "transformer";
  CHECK_THROWS_WITH(read_model_settings(unknown, "g.safetensors", c),
                    Catch::Contains("unknown model 'transformer': use linear, mlp or gpt"));
  CHECK_THROWS_WITH(read_model_settings(Settings{}, "e.safetensors", c), Catch::Contains("records no model"));
}

TEST_CASE("model kinds: an option of another kind is a usage error naming both", "[apps][model_kinds]") {
  TrainConfig c;
  c.model = "gpt";
  c.given = {"in", "lr"};
  CHECK_THROWS_WITH(check_train_config(c), "--in is not an option of --model gpt (its options: --attention, --context, --eval-every, "
                                 "--eval-windows, --gelu, --heads, --layers, --width)");
  c.model = "linear";
  c.given = {"hidden"};
  CHECK_THROWS_WITH(check_train_config(c), "--hidden is not an option of --model linear (its options: --in, --out)");
  c.given = {"in", "out", "lr", "batch"};  // its own and the general ones
  CHECK_NOTHROW(check_train_config(c));
  c.model = "mlp";
  c.given = {"hidden", "layers", "in"};
  CHECK_NOTHROW(check_train_config(c));
  c.given = {"eval-every"};
  CHECK_THROWS_WITH(check_train_config(c), Catch::StartsWith("--eval-every is not an option of --model mlp"));
  // Every option some kind takes is named by the table, and each kind takes its own shape.
  for (const ModelKind& kind : model_kinds())
    for (const ShapeField& f : kind.shape) {
      CHECK(model_options().count(f.name) == 1);
      CHECK(takes_option(kind, f.name));
    }
}

TEST_CASE("model kinds: a kind's defaults fill only the options not given", "[apps][model_kinds]") {
  TrainConfig gpt;
  gpt.model = "gpt";
  apply_kind_defaults(gpt, {"lr"});
  CHECK(gpt.lr == TrainConfig{}.lr);  // given: kept
  CHECK(gpt.steps == 1500);
  CHECK(gpt.warmup == 100);
  CHECK(gpt.schedule == "cosine");
  TrainConfig short_run;
  short_run.model = "gpt";
  short_run.steps = 50;
  apply_kind_defaults(short_run, {"steps"});
  CHECK(short_run.warmup == 5);  // the kind's warmup, cut to a tenth of a shorter run
  TrainConfig constant;
  constant.model = "gpt";
  apply_kind_defaults(constant, {"schedule"});  // --schedule constant: no warmup to take
  CHECK(constant.warmup == 0);
  CHECK(constant.steps == 1500);
  TrainConfig linear;
  apply_kind_defaults(linear, {});
  CHECK(linear.steps == TrainConfig{}.steps);  // no defaults of its own
  CHECK(linear.lr == TrainConfig{}.lr);
}
