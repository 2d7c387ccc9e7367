// belay validate on a GPT checkpoint (apps/run/validate_gpt.h), on a tiny trained GPT: the
// counts are the definition's (written here as plain loops over forward), the FP32 loss is
// the one the training run's held-out evaluation reported, a near-tie margin and a tolerance
// act as stated, an FP16 overflow fails where BF16 holds, and bad input is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "amp/autocast.h"
#include "apps/run/sample.h"
#include "apps/run/token_dataset.h"
#include "apps/run/validate_gpt.h"
#include "autograd/graph.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "tests/apps/run/tiny_gpt.h"
#include "tests/tolerance.h"

using namespace belay;

namespace {

constexpr int64_t kWindows = 3;

// run_validate_gpt's result with its report parsed back from the JSON text.
struct Validated {
  int exit_code;
  nlohmann::json report;
};
Validated validate_gpt(const ValidateConfig& c, std::ostream& out) {
  const ValidateResult r = run_validate_gpt(c, out);
  return {r.exit_code, nlohmann::json::parse(r.report)};
}

// The tiny GPT trained 5 steps, its held-out loss evaluated after the last on kWindows windows.
struct Fixture {
  std::string tokens, ck;
  double heldout = 0;
  explicit Fixture(const std::string& prefix) : tokens(test::tiny_tokens_file(prefix)) {
    TrainConfig c = test::tiny_gpt_config(tokens, 5);
    c.eval_every = 5;
    c.eval_windows = kWindows;
    c.checkpoint = ck = test::temp_path(prefix, "gpt.ck");
    std::ostringstream out;
    heldout = run_training(c, out).heldout.back().second;
  }
  ~Fixture() {
    std::remove(tokens.c_str());
    std::remove(ck.c_str());
  }
  ValidateConfig config(DType dtype) const {
    ValidateConfig v;
    v.dtype = dtype;
    v.checkpoint = ck;
    v.data = tokens;
    v.windows = kWindows;
    return v;
  }
};

struct Counts {
  int64_t tokens = 0, changed = 0, near_ties = 0;
};

// The definition: every held-out position's argmax in FP32 and under autocast; a near-tie
// when the FP32 top-2 gap is under `margin`.
Counts count_by_hand(const Fixture& f, DType dtype, double margin) {
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(f.ck);
  const auto data = load_token_dataset(f.tokens, 8, 0);
  HeldOutBatches batches(*data, 1, kWindows);
  Counts n;
  NoGrad no_grad;
  while (std::optional<Batch> b = batches.next(Device::cpu())) {
    const std::vector<float> ref = model->forward(Var(b->x)).value().to_vector();
    std::vector<float> amp;
    {
      Autocast autocast(dtype);
      amp = model->forward(Var(b->x)).value().to_vector();
    }
    for (size_t p = 0; p * 128 < ref.size(); ++p) {
      size_t r = 0, a = 0;
      for (size_t j = 1; j < 128; ++j) {
        if (ref[p * 128 + j] > ref[p * 128 + r]) r = j;
        if (amp[p * 128 + j] > amp[p * 128 + a]) a = j;
      }
      float second = -INFINITY;
      for (size_t j = 0; j < 128; ++j)
        if (j != r) second = std::max(second, ref[p * 128 + j]);
      ++n.tokens;
      n.changed += r != a;
      n.near_ties += ref[p * 128 + r] - second < margin;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("validate gpt: decisions counted as defined, the FP32 loss the run's held-out loss", "[apps][validate][gpt]") {
  const Fixture f("vgpt0");
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    std::ostringstream out;
    const ValidateConfig c = f.config(dtype);
    REQUIRE(validates_gpt(c));
    const Validated r = validate_gpt(c, out);
    const nlohmann::json& d = r.report["comparison"]["decisions"];
    const double u = 0.5 * static_cast<double>(finfo(dtype).eps);
    const double margin = 64.0 * u;  // the default: 64u
    CHECK(r.report["thresholds"]["rtol"] == 8.0 * u * (6 * 1 + 1));  // 8u per product on a 1-block path
    CHECK(r.report["thresholds"]["tie_margin"] == margin);
    const Counts n = count_by_hand(f, dtype, margin);
    CHECK(n.tokens == kWindows * 8);
    CHECK(d["tokens"] == n.tokens);
    CHECK(d["changed"] == n.changed);
    CHECK(d["near_ties"] == n.near_ties);
    // The same windows as the run's evaluation, both in FP32: the mean of 24 losses.
    const double loss = r.report["comparison"]["loss"]["fp32"];
    test::check_close({static_cast<float>(loss)}, {f.heldout}, test::tolerance_for(DType::F32, DType::F32, 128 * 24));
    CHECK(r.report["comparison"]["loss"]["amp"].is_number());
    CHECK(out.str().find("thresholds (fixed before the runs)") < out.str().find("\ndecisions ("));
    CHECK(r.exit_code == (r.report["pass"] ? 0 : 1));
  }
}

TEST_CASE("validate gpt: a wide near-tie margin takes every flip, a zero tolerance fails", "[apps][validate][gpt]") {
  const Fixture f("vgpt1");
  ValidateConfig c = f.config(DType::BF16);
  c.tie_margin = 1e9;  // every position is a near-tie: a flip there is not counted against --max-flips
  std::ostringstream out;
  Validated r = validate_gpt(c, out);
  const nlohmann::json& d = r.report["comparison"]["decisions"];
  CHECK(d["near_ties"] == d["tokens"]);
  CHECK(d["near_tie_changed"] == d["changed"]);
  CHECK(r.report["comparison"]["checks"][3]["pass"] == true);
  c = f.config(DType::BF16);
  c.rtol = 0.0;
  c.atol = 1e-30;  // bf16 logits equal to fp32's to 1e-30 at every position: no
  r = validate_gpt(c, out);
  CHECK(r.exit_code == 1);
  CHECK(r.report["comparison"]["logits"]["out_of_tolerance"].get<int64_t>() > 0);
  CHECK(r.report["comparison"]["checks"][2]["pass"] == false);
}

TEST_CASE("validate gpt: an FP16 overflow in the head fails, BF16 holds it", "[apps][validate][gpt]") {
  const Fixture f("vgpt2");
  // The same checkpoint with ln_f's gain times 1e7: the head's input leaves FP16's range
  // (65504), not FP32's or BF16's.
  const SafetensorsFile file = read_safetensors(f.ck);
  NamedTensors tensors;
  for (const std::string& name : file.names()) {
    Tensor t = file.tensor(name);
    if (name == "ln_f.weight") {
      std::vector<float> v = t.to_vector();
      for (float& x : v) x *= 1e7f;
      t = Tensor::from_vector(v, t.shape());
    }
    tensors.push_back({name, t});
  }
  std::map<std::string, std::string> meta = file.metadata();
  meta.erase(kChecksumKey);
  meta.erase(kHeaderChecksumKey);
  const std::string big = test::temp_path("vgpt2", "big.ck");
  write_safetensors(big, tensors, meta);
  ValidateConfig c = f.config(DType::F16);
  c.checkpoint = big;
  std::ostringstream out;
  Validated r = validate_gpt(c, out);
  CHECK(r.exit_code == 1);
  CHECK(out.str().find("FAIL  amp: no non-finite value (24 positions") != std::string::npos);
  CHECK(out.str().find("PASS  baseline: FP32 reference finite") != std::string::npos);
  c.dtype = DType::BF16;
  r = validate_gpt(c, out);
  CHECK(r.report["comparison"]["checks"][1]["pass"] == true);
  std::remove(big.c_str());
}

TEST_CASE("validate gpt: bad input is refused with a line that says what to do", "[apps][validate][gpt]") {
  const Fixture f("vgpt3");
  auto refused = [](const ValidateConfig& c, const std::string& what) {
    INFO(what);
    std::ostringstream out;
    CHECK_THROWS_AS(run_validate_gpt(c, out), UsageError);
    CHECK_THROWS_WITH(run_validate_gpt(c, out), Catch::Contains(what));
  };
  ValidateConfig c = f.config(DType::F16);
  c.data.clear();
  refused(c, "give --data TOKENS.safetensors");
  c = f.config(DType::F32);
  refused(c, "give --dtype fp16|bf16");
  c = f.config(DType::F16);
  c.windows = 0;
  refused(c, "--windows must be at least 1");
  c = f.config(DType::F16);
  c.train_steps = 3;
  refused(c, "train a GPT with belay train");
  c = f.config(DType::F16);
  c.checkpoint.clear();
  c.model = "gpt";
  refused(c, "give --checkpoint");
  // Another vocabulary: a byte-level file (256) for a 128-token model.
  const std::string other = test::temp_path("vgpt3", "bytes.safetensors");
  std::vector<int64_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 256);
  write_safetensors(other, {}, {{"tokens.format", kTokensFormat}, {"tokens.vocab", "256"}},
                    {{"train", ids}, {"heldout", ids}});
  c = f.config(DType::F16);
  c.data = other;
  refused(c, "has a vocabulary of 256 tokens, the checkpoint's GPT 128");
  std::remove(other.c_str());
}
