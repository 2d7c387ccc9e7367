// The numerics census in a training run (belay train --census): a GPT under fp16 whose loss
// scale is held at 1 shows gradient flushed to zero in FP16 that a scale of 2^12 removes; the
// skipped step of --inject-inf names the tensor that got the inf, in the step log's
// nonfinite_tensors column and in the census file; --census-every records every N-th step and
// every skipped one; the summary gives the advice.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "amp/census_log.h"
#include "apps/run/token_dataset.h"
#include "apps/run/train.h"
#include "engine/error.h"
#include "tests/files.h"
#include "tolerance.h"

using namespace belay;

namespace {

std::string text(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i) s += "def f" + std::to_string((i * 7) % 13) + "(x):\n    return x + " + std::to_string(i % 5) + "\n";
  return s;
}

TrainConfig census_config(int64_t steps, float init_scale, const std::string& census) {
  TrainConfig c;
  c.model = "gpt";
  c.layers = 2;
  c.width = 16;
  c.heads = 2;
  c.batch = 4;
  c.steps = steps;
  c.lr = 1e-2f;
  c.dtype = DType::F16;
  c.scaler.enabled = true;
  c.scaler.init_scale = init_scale;
  c.scaler.growth_interval = 1000000;  // the scale stays where it starts
  c.census = census;
  c.quiet = true;
  c.make_dataset = [] {
    return std::make_unique<TokenDataset>(bytes_to_tokens(text(60)), bytes_to_tokens(text(8)), 128, 12, 5, "tiny text");
  };
  return c;
}

TrainResult run(const TrainConfig& c, std::string* printed = nullptr) {
  std::ostringstream out;
  TrainResult r = run_training(c, out);
  if (printed) *printed = out.str();
  return r;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  for (std::string f; std::getline(s, f, ',');) out.push_back(f);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

uint64_t total_underflow(const TrainResult& r) {
  uint64_t u = 0;
  for (const StepRow& row : r.rows)
    for (const TensorCensus& c : row.census) u += c.underflow;
  return u;
}

}  // namespace

TEST_CASE("census: a GPT under fp16 at scale 1 flushes gradient to zero that scale 2^12 keeps", "[apps][train][census]") {
  const TrainResult low = run(census_config(4, 1.0f, test::temp_path("census", "low.csv")));
  const TrainResult high = run(census_config(4, 4096.0f, test::temp_path("census", "high.csv")));
  REQUIRE(low.rows.size() == 4);
  REQUIRE(high.rows.size() == 4);
  CHECK(low.skipped == 0);
  CHECK(high.skipped == 0);
  for (const StepRow& row : low.rows) REQUIRE(!row.census.empty());
  const uint64_t u_low = total_underflow(low), u_high = total_underflow(high);
  INFO("elements flushed to zero in FP16: " << u_low << " at scale 1, " << u_high << " at scale 2^12");
  CHECK(u_low > 0);
  CHECK(u_high < u_low / 10);
  // The headroom at scale 1 is the scale's doubling room: 2^12 takes 12 bits of it.
  const double h_low = low.rows[0].census[0].headroom_bits(DType::F16);
  const double h_high = high.rows[0].census[0].headroom_bits(DType::F16);
  CHECK(h_low - h_high == Approx(12.0).margin(0.5));  // the gradients are the same up to FP16 rounding
}

TEST_CASE("census: --inject-inf's skipped step names the tensor that got the inf", "[apps][train][census]") {
  const std::string census = test::temp_path("census", "inject.csv"), csv = test::temp_path("census", "inject_log.csv");
  TrainConfig c = census_config(6, 4096.0f, census);
  c.csv = csv;
  c.census_every = 4;
  c.inject_inf = {2};
  std::string printed;
  c.quiet = false;
  const TrainResult r = run(c, &printed);
  REQUIRE(r.rows.size() == 6);
  CHECK(r.rows[2].skipped);
  CHECK(r.rows[2].skip_reason == "nonfinite_grad");  // the canonical column keeps its words
  // The trainer plants the inf in element 0 of the first parameter's gradient: wte.weight.
  const std::string named = nonfinite_tensors(r.rows[2].census);
  CHECK(named == "wte.weight");
  int with_inf = 0;
  for (const TensorCensus& t : r.rows[2].census) with_inf += t.nonfinite > 0 ? 1 : 0;
  CHECK(with_inf == 1);
  // The step log: the 8 columns, then nonfinite_tensors, filled on the skipped row only.
  const std::vector<std::string> log = lines_of(csv);
  REQUIRE(log.size() == 7);
  CHECK(log[0] == std::string(kStepLogHeader) + ",nonfinite_tensors");
  CHECK(fields(log[3]).back() == "wte.weight");
  CHECK(fields(log[2]).back().empty());
  // The census file: steps 0 and 4 (every 4th) and the skipped step 2, every tensor each.
  const std::vector<std::string> rows = lines_of(census);
  REQUIRE(!rows.empty());
  CHECK(rows[0] == kCensusHeader);
  std::map<std::string, int> per_step;
  for (size_t i = 1; i < rows.size(); ++i) ++per_step[fields(rows[i])[0]];
  CHECK(per_step.size() == 3);
  CHECK(per_step.count("0") == 1);
  CHECK(per_step.count("2") == 1);
  CHECK(per_step.count("4") == 1);
  CHECK(per_step["2"] == static_cast<int>(r.rows[2].census.size()));
  bool found = false;
  for (size_t i = 1; i < rows.size(); ++i) {
    const std::vector<std::string> f = fields(rows[i]);
    if (f[0] == "2" && f[1] == "wte.weight") found = f[3] == "1" && f[9] == "1";
  }
  CHECK(found);
  // The summary: a line per tensor class and the advice.
  CHECK(printed.find("census blocks.*.mlp.fc.weight: least headroom") != std::string::npos);
  CHECK(printed.find("census advice: ") != std::string::npos);
}

TEST_CASE("census: the tensor classes, the advice and bad options", "[apps][train][census]") {
  CHECK(tensor_class("blocks.11.attn.q.weight") == "blocks.*.attn.q.weight");
  CHECK(tensor_class("wte.weight") == "wte.weight");
  CHECK(tensor_class("layer2.weight") == "layer2.weight");
  std::vector<TensorCensus> named(4);
  const char* names[] = {"a", "b", "c", "d"};
  const uint64_t bad[] = {0, 1, 3, 2};
  for (int i = 0; i < 4; ++i) {
    named[i].name = names[i];
    named[i].nonfinite = bad[i];
  }
  CHECK(nonfinite_tensors(named) == "b(+2 more)");
  named[2].nonfinite = named[3].nonfinite = 0;
  CHECK(nonfinite_tensors(named) == "b");
  named[1].nonfinite = 0;
  CHECK(nonfinite_tensors(named).empty());
  CensusSummary s(DType::F16);
  StepRow row;
  row.step = 7;
  TensorCensus a;
  a.name = "blocks.0.fc.weight";
  a.numel = 1000;
  a.amax = 65504.0f / 16.0f;  // 4 bits of headroom
  a.underflow = 41;
  row.census = {a};
  s.observe(row, 1024.0f);
  const std::vector<std::string> lines = s.lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "census blocks.*.fc.weight: least headroom 4.0 bits (blocks.0.fc.weight, step 7); most flushed to "
                    "zero in fp16 4.1% (blocks.0.fc.weight, step 7)");
  CHECK(lines[1] == "census advice: the loss scale could be 2^4 higher: the least headroom over steps 7-7 was 4.0 "
                    "bits (blocks.0.fc.weight); at most 4.1% of blocks.0.fc.weight's gradient flushes to zero in fp16 "
                    "at scale 2^10");
  TrainConfig c = census_config(2, 1.0f, test::temp_path("census", "bad.csv"));
  c.census_every = 0;
  CHECK_THROWS_WITH(run(c), Catch::Contains("--census-every must be >= 1"));
  c.census_every = 1;
  c.fused = false;
  CHECK_THROWS_WITH(run(c), Catch::Contains("fused guard"));
}

TEST_CASE("census: --census-casts writes the casts' rows, advises, and changes no bit of the run", "[apps][train][census]") {
  const std::string census = test::temp_path("census", "casts.csv");
  TrainConfig c = census_config(3, 1.0f, census);
  c.census_casts = true;
  c.low_precision_grads = true;  // --grad-dtype compute: the guard sees fp16 buffers
  c.quiet = false;               // the summary
  std::string printed;
  const TrainResult with = run(c, &printed);
  c.quiet = true;
  c.census_casts = false;
  c.census = test::temp_path("census", "nocasts.csv");
  const TrainResult without = run(c);
  REQUIRE(with.rows.size() == 3);
  REQUIRE(without.rows.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(test::bits_of(std::vector<float>{with.rows[i].loss, with.rows[i].grad_l2_pre_clip}) ==
          test::bits_of(std::vector<float>{without.rows[i].loss, without.rows[i].grad_l2_pre_clip}));
    CHECK(without.rows[i].cast_census.empty());
    CHECK(!with.rows[i].cast_census.empty());
  }
  // With fp16 buffers at scale 1 the rounding into them flushes gradient: counted at the cast
  // (the guard alone would see 0: the buffer cannot hold what it flushed).
  CHECK(total_underflow(with) > 0);
  CHECK(total_underflow(with) == total_underflow(without));  // the buffers' counts need no --census-casts
  std::map<std::string, int> cast_rows;
  for (const std::string& line : lines_of(census))
    if (line.rfind("0,cast:", 0) == 0) ++cast_rows[fields(line)[1]];
  CHECK(cast_rows.count("cast:wte.weight") == 1);                  // a working copy
  CHECK(cast_rows.count("cast:blocks.0.mlp.fc.linear.input") == 1);  // an activation
  CHECK(cast_rows.count("cast:head.linear.input") == 1);
  CHECK(printed.find("census cast blocks.*.mlp.fc.linear.input: least headroom") != std::string::npos);
  CHECK(printed.find("census cast advice: ") != std::string::npos);
  c.census.clear();
  c.census_casts = true;
  CHECK_THROWS_WITH(run(c), Catch::Contains("--census-casts counts into the census file"));
}
