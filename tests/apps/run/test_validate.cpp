// `belay validate`: the default set passes in fp16 and bf16 with the thresholds printed
// before the runs; it fails, showing the rows, on an FP16 overflow (an input of 1e5), on a
// near-tie that flips, and on a non-finite FP32 reference (as a failure of the baseline).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/run/validate.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"
#include "tolerance.h"

using namespace belay;

namespace {
std::string tmp(const std::string& name) {
  return "/tmp/belay_validate_test_" + std::to_string(::getpid()) + "_" + name;
}

// The result, its report as JSON text (what --json writes) and parsed back.
struct Validated {
  int exit_code;
  std::string text;
  nlohmann::json report;
};
Validated validate_with(const ValidateConfig& c, std::string* text = nullptr) {
  std::ostringstream out;
  const ValidateResult r = run_validate(c, out);
  if (text) *text = out.str();
  return {r.exit_code, r.report, nlohmann::json::parse(r.report)};
}

// 24 rows of N(0, 1) for the default model (16 inputs, 4 classes), labels 0..3; `patch`
// edits x before it is written.
std::string write_set(const std::string& name, const std::function<void(std::vector<float>&)>& patch) {
  Rng rng(11);
  std::vector<float> x(24 * 16);
  for (float& v : x) v = rng.normal();
  patch(x);
  std::vector<int64_t> y(24);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 4);
  const std::string path = tmp(name);
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{24, 16})}}, {}, {{"y", y}});
  return path;
}

bool check_passed(const nlohmann::json& report, const std::string& name) {
  for (const auto& c : report["comparison"]["checks"])
    if (c["check"] == name) return c["pass"];
  FAIL("no check named " << name);
  return false;
}
}  // namespace

TEST_CASE("validate: the default set passes in fp16 and bf16, thresholds stated before the runs", "[apps][validate]") {
  for (DType dt : {DType::F16, DType::BF16}) {
    ValidateConfig c;
    c.dtype = dt;
    std::string text;
    const Validated r = validate_with(c, &text);
    INFO(text);
    CHECK(r.exit_code == 0);
    CHECK(r.report["pass"] == true);
    // The thresholds come from the dtype's unit roundoff u: rtol 16u, atol u, tie margin 64u.
    const double u = 0.5 * static_cast<double>(finfo(dt).eps);
    belay::test::check_close(
        {r.report["thresholds"]["rtol"].get<float>(), r.report["thresholds"]["tie_margin"].get<float>()},
        {16 * u, 64 * u}, belay::test::tolerance_for(DType::F32, DType::F32));
    // Printed before any score.
    const size_t thresholds = text.find("thresholds (fixed before the runs)"), scores = text.find("scores per output");
    CHECK(thresholds != std::string::npos);
    CHECK(thresholds < scores);
    // Every kind of row, the near-ties built under the stated margin and flagged as such.
    CHECK(r.report["set"]["kinds"]["ordinary"] == 64);
    for (const char* kind : {"large", "near_zero", "near_tie"}) CHECK(r.report["set"]["kinds"][kind] == 16);
    CHECK(r.report["comparison"]["decisions"]["near_ties"].get<int64_t>() >= 16);
    CHECK(r.report["comparison"]["decisions"]["changed"] == 0);
  }
}

TEST_CASE("validate: an input of 1e5 overflows fp16 (exit 1, the row shown), bf16 holds it", "[apps][validate]") {
  const std::string set = write_set("overflow.safetensors", [](std::vector<float>& x) { x[5 * 16 + 2] = 1e5f; });
  ValidateConfig c;
  c.data = set;
  std::string text;
  const Validated r = validate_with(c, &text);
  INFO(text);
  CHECK(r.exit_code == 1);
  CHECK_FALSE(check_passed(r.report, "amp: no non-finite value"));
  CHECK(check_passed(r.report, "baseline: FP32 reference finite"));
  REQUIRE(r.report["comparison"]["nonfinite_rows"].size() == 1);
  CHECK(r.report["comparison"]["nonfinite_rows"][0]["row"] == 5);
  CHECK(text.find("rows where the AMP run is not finite (1):\n  row    5") != std::string::npos);
  // Its decision is gone too: listed among the changed ones.
  CHECK(r.report["comparison"]["decisions"]["changed_rows"][0]["amp_decision"] == -1);
  c.dtype = DType::BF16;
  const Validated b = validate_with(c);
  CHECK(check_passed(b.report, "amp: no non-finite value"));
  std::remove(set.c_str());
}

TEST_CASE("validate: near-ties built under a margin bf16 cannot keep flip (exit 1, rows listed)", "[apps][validate]") {
  ValidateConfig c;
  c.dtype = DType::BF16;
  c.tie_margin = 0.002;  // ties in [0.001, 0.002): below bf16's score error at scale ~1
  const std::string saved = tmp("ties.safetensors");
  c.save_set = saved;
  std::string text;
  const Validated r = validate_with(c, &text);
  INFO(text);
  CHECK(r.exit_code == 1);
  CHECK_FALSE(check_passed(r.report, "changed decisions <= max-flips"));
  const auto& changed = r.report["comparison"]["decisions"]["changed_rows"];
  REQUIRE(changed.size() >= 1);
  for (const auto& row : changed) {
    CHECK(row["near_tie"] == true);
    CHECK(row["kind"] == "near_tie");
    CHECK(row["ref"].size() == 4);
    CHECK(row["amp"].size() == 4);
    CHECK(text.find("row  " + std::to_string(row["row"].get<int64_t>())) != std::string::npos);
  }
  // The saved set is the same set: validating it from the file gives the same verdict.
  ValidateConfig again;
  again.dtype = DType::BF16;
  again.tie_margin = 0.002;
  again.data = saved;
  const Validated g = validate_with(again);
  CHECK(g.report["comparison"]["decisions"]["changed"] == r.report["comparison"]["decisions"]["changed"]);
  CHECK(g.report["set"]["kinds"]["near_tie"] == 16);
  // --max-flips is the project's threshold: allowing them passes.
  c.save_set.clear();
  c.max_flips = changed.size();
  CHECK(validate_with(c).exit_code == 0);
  std::remove(saved.c_str());
}

TEST_CASE("validate: a non-finite FP32 reference is a failure of the baseline, and says so", "[apps][validate]") {
  const std::string set = write_set("nan.safetensors", [](std::vector<float>& x) { x[9 * 16] = NAN; });
  ValidateConfig c;
  c.data = set;
  std::string text;
  const Validated r = validate_with(c, &text);
  CHECK(r.exit_code == 1);
  CHECK_FALSE(check_passed(r.report, "baseline: FP32 reference finite"));
  CHECK(r.report["comparison"]["baseline_nonfinite_rows"][0]["row"] == 9);
  CHECK(text.find("a failure of the baseline, not of AMP") != std::string::npos);
  std::remove(set.c_str());
}

TEST_CASE("validate --train: both runs' curves, counts, scale and divergence, the JSON file", "[apps][validate]") {
  ValidateConfig c;
  c.train_steps = 12;
  c.json = tmp("train.json");
  c.rtol = 0.05;  // the project's tolerance for two trained models (stated before the runs)
  const Validated r = validate_with(c);
  const auto& t = r.report["train"];
  for (const char* run : {"fp32", "fp16"}) {
    CHECK(t["runs"][run]["loss"].size() == 12);
    CHECK(t["runs"][run]["applied"].get<int64_t>() + t["runs"][run]["skipped"].get<int64_t>() == 12);
  }
  CHECK(t["runs"]["fp16"]["scale"]["max"] == 65536.0);  // loss scaling on for fp16
  CHECK(t["runs"]["fp32"]["scale"]["max"] == 1.0);
  CHECK(t["weight_divergence"]["rel_l2"].get<double>() > 0.0);  // the runs did differ ...
  CHECK(r.exit_code == 0);                                      // ... within the stated tolerance
  std::ifstream f(c.json);
  const std::string written((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(written == r.text);
  const nlohmann::json j = nlohmann::json::parse(written);
  CHECK(j["thresholds"]["rtol"] == 0.05);
  CHECK(j["pass"] == true);
  std::remove(c.json.c_str());
}

TEST_CASE("validate: bad usage is a clear UsageError", "[apps][validate]") {
  ValidateConfig c;
  c.dtype = DType::F32;
  CHECK_THROWS_AS(validate_with(c), UsageError);
  c.dtype = DType::F16;
  c.init = "a";
  c.checkpoint = "b";
  CHECK_THROWS_AS(validate_with(c), UsageError);
  ValidateConfig d;
  d.data = tmp("missing.safetensors");
  CHECK_THROWS_AS(validate_with(d), UsageError);
}

TEST_CASE("validate: a regression set is judged by its errors, extremes and R^2, with no decisions",
          "[apps][validate]") {
  Rng rng(5);
  std::vector<float> x(32 * 16), y(32 * 4);
  for (float& v : x) v = rng.normal();
  for (float& v : y) v = rng.normal();
  const std::string path = tmp("regression.safetensors");
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{32, 16})}, {"y", Tensor::from_vector(y, Shape{32, 4})}});
  ValidateConfig c;
  c.data = path;
  c.model = "linear";
  const Validated r = validate_with(c);
  CHECK(r.report["set"]["task"] == "regression");
  CHECK(r.report["comparison"]["quality"]["measure"] == "r2");
  CHECK(r.report["comparison"]["decisions"]["changed_rows"].empty());
  CHECK(r.report["comparison"]["outputs"].size() == 4);
  CHECK(r.exit_code == 0);
  std::remove(path.c_str());
}

TEST_CASE("validate: --min-quality holds both runs to it, the untrained reference misses 0.9", "[apps][validate]") {
  ValidateConfig c;
  c.min_quality = 0.9;  // an untrained 4-class model is near chance (0.25)
  std::string text;
  const Validated r = validate_with(c, &text);
  CHECK(r.exit_code == 1);
  CHECK_FALSE(check_passed(r.report, "baseline: quality >= min-quality"));
  CHECK_FALSE(check_passed(r.report, "amp: quality >= min-quality"));
  CHECK(check_passed(r.report, "scores within tolerance"));
  c.min_quality = 0.1;
  CHECK(validate_with(c).exit_code == 0);
}
