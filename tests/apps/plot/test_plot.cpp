// `belay plot`: step logs read strictly, and the picture holds what it must: one line per
// series, a mark for every skipped step in its reason's colour, both runs when overlaid.
// (Well-formedness by an XML parser and rsvg-convert: tests/apps/cli/cli_test.sh.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/plot/plot.h"
#include "apps/run/train.h"
#include "engine/error.h"
#include "tests/apps/run/tiny_gpt.h"
#include "tests/files.h"

using namespace belay;
using belay::test::spit;

namespace {

std::string tmp(const std::string& name) { return test::temp_path("plot_test", name); }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("plot: a step log is read as written, and anything else is refused with its line", "[apps][plot]") {
  const std::string csv = tmp("run.csv");
  TrainConfig c;
  c.dtype = DType::F16;
  c.steps = 12;
  c.inject_inf = {5};
  c.csv = csv;
  c.quiet = true;
  std::ostringstream out;
  const TrainResult r = run_training(c, out);
  const RunLog log = read_step_log(csv);
  REQUIRE(log.rows.size() == r.rows.size());
  for (size_t i = 0; i < r.rows.size(); ++i) {
    CHECK(format_step_row(log.rows[i]) == format_step_row(r.rows[i]));  // every value back, bit for bit
  }
  CHECK(log.policy.empty());

  const std::string bad = tmp("bad.csv");
  spit(bad, "step,loss\n0,1\n");
  CHECK_THROWS_WITH(read_step_log(bad), Catch::Contains("not a belay step log"));
  spit(bad, std::string(kStepLogHeader) + "\n0,0.01,1,1,1,0,,1\n1,0.01,1,1,oops,0,,1\n");
  CHECK_THROWS_WITH(read_step_log(bad), Catch::Contains("line 3") && Catch::Contains("'oops'"));
  spit(bad, std::string(kStepLogHeader) + "\n0,0.01,1,1,1,2,,1\n");
  CHECK_THROWS_WITH(read_step_log(bad), Catch::Contains("skipped must be 0 or 1"));
  for (const char* step : {"+4", " 4", "-1", "4.0", "1e3", "x", "", "9999999999999999999"}) {  // read as the census file's (parse_count)
    spit(bad, std::string(kStepLogHeader) + "\n" + step + ",0.01,1,1,1,0,,1\n");
    CHECK_THROWS_WITH(read_step_log(bad), Catch::Contains("line 2: step '" + std::string(step) + "' is not a count"));
  }
  spit(bad, std::string(kStepLogHeader) + ",heldout_loss\n0,0.01,1,1,1,0,,1,\n");  // the last field empty: kept
  CHECK(std::isnan(read_step_log(bad).heldout.at(0)));
  spit(bad, std::string(kStepLogHeader) + "\n");
  CHECK_THROWS_WITH(read_step_log(bad), Catch::Contains("no rows"));
  CHECK_THROWS_WITH(read_step_log(tmp("missing.csv")),
                    Catch::Contains("cannot read step log") && Catch::Contains("No such file or directory"));
  const std::string dir = std::filesystem::path(csv).parent_path().string();  // read as empty, before
  CHECK_THROWS_WITH(read_step_log(dir), Catch::Equals("step log '" + dir + "' is a directory"));
  CHECK_THROWS_AS(write_plot({log}, tmp("run.jpg")), UsageError);
  std::remove(csv.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("plot: every skipped step is marked in its reason's colour, every series drawn", "[apps][plot]") {
  RunLog a;
  a.name = "amp & <fp16>.csv";  // escaped in the picture
  for (int64_t s = 0; s < 20; ++s) {
    StepRow r;
    r.step = s;
    r.lr = 0.01f;
    r.loss = 1.0f / static_cast<float>(s + 1);
    r.grad_l2_pre_clip = r.grad_l2_post_clip = 2.0f;
    r.scaler_scale = s < 5 ? 65536.0f : 32768.0f;
    if (s == 5) {
      r.skipped = true;
      r.skip_reason = "nonfinite_grad";
      r.grad_l2_pre_clip = INFINITY;
      r.grad_l2_post_clip = 0.0f;
    }
    if (s == 9) {
      r.skipped = true;
      r.skip_reason = "nonfinite_loss";
      r.loss = NAN;
    }
    a.rows.push_back(r);
  }
  const std::string one = plot_svg({a});
  // 4 panels, one vertical mark in each for each skip.
  CHECK(count(one, "stroke=\"#d62728\" stroke-width=\"1.50\"") == 4);  // nonfinite_grad at step 5
  CHECK(count(one, "stroke=\"#ff7f0e\" stroke-width=\"1.50\"") == 4);  // nonfinite_loss at step 9
  CHECK(count(one, ">inf</text>") == 1);                               // the norm that has no place on the axis
  CHECK(one.find("amp &amp; &lt;fp16&gt;.csv (20 rows, 2 skipped)") != std::string::npos);
  CHECK(one.find("<fp16>") == std::string::npos);
  // Loss (broken at the NaN: 2 lines), pre-clip (broken at the inf: 2), post-clip (not drawn
  // on either skipped step: 3), scale, LR.
  CHECK(count(one, "<polyline") == 9);
  CHECK(one.find("<tspan") != std::string::npos);  // the scale's axis in powers of two

  RunLog b = a;
  b.name = "fp32.csv";
  for (StepRow& r : b.rows) r.skipped = false;
  const std::string two = plot_svg({a, b});
  CHECK(two.find("fp32.csv (20 rows, 0 skipped)") != std::string::npos);
  CHECK(count(two, "stroke=\"#2ca02c\"") > count(one, "stroke=\"#2ca02c\""));  // the second run's colour
  CHECK_THROWS_AS(plot_svg({}), UsageError);
  CHECK_THROWS_AS(plot_svg({a, a, a, a, a}), UsageError);
}

TEST_CASE("plot: rows a rollback abandoned are drawn faint and the policy change is marked", "[apps][plot]") {
  RunLog a;
  a.name = "rollback.csv";
  for (int64_t s : {0, 1, 2, 3, 4, 2, 3, 4, 5}) {
    StepRow r;
    r.step = s;
    r.lr = 0.01f;
    r.loss = 1.0f;
    r.grad_l2_pre_clip = r.grad_l2_post_clip = 1.0f;
    r.scaler_scale = 1.0f;
    a.rows.push_back(r);
    a.policy.push_back(a.rows.size() <= 5 ? "fp16@lr=0.01" : "fp32@lr=0.01");
  }
  const std::string svg = plot_svg({a});
  CHECK(count(svg, "policy: fp32@lr=0.01") == 1);
  CHECK(count(svg, "opacity=\"0.30\"") > 0);
}

TEST_CASE("plot: the README demo's picture shows the injected skip and the scale's backoff", "[apps][plot]") {
  // The demo: bash apps/belay.sh train --dtype fp16 --steps 30 --inject-inf 5 (docs/demo-run.svg).
  TrainConfig c;
  c.dtype = DType::F16;
  c.steps = 30;
  c.inject_inf = {5};
  c.quiet = true;
  std::ostringstream out;
  RunLog log;
  log.name = "run.csv";
  log.rows = run_training(c, out).rows;
  const std::string svg = plot_svg({log});
  // The skip: one red mark per panel, all at one x.
  std::vector<std::string> mark_x;
  for (size_t at = svg.find("<line x1=\""); at != std::string::npos; at = svg.find("<line x1=\"", at + 1)) {
    const size_t end = svg.find("/>", at);
    const std::string line = svg.substr(at, end - at);
    if (line.find("stroke=\"#d62728\" stroke-width=\"1.50\"") == std::string::npos) continue;
    mark_x.push_back(line.substr(10, line.find('"', 10) - 10));
  }
  REQUIRE(mark_x.size() == 4);
  for (const std::string& x : mark_x) CHECK(x == mark_x[0]);
  // The backoff: the only vertical drop of any line, at the skip's x, going down (a smaller scale).
  int drops = 0;
  for (size_t at = svg.find("points=\""); at != std::string::npos; at = svg.find("points=\"", at + 1)) {
    std::istringstream pts(svg.substr(at + 8, svg.find('"', at + 8) - at - 8));
    std::string prev, cur;
    while (pts >> cur) {
      if (!prev.empty()) {
        const std::string px = prev.substr(0, prev.find(',')), cx = cur.substr(0, cur.find(','));
        const double py = std::stod(prev.substr(prev.find(',') + 1)), cy = std::stod(cur.substr(cur.find(',') + 1));
        if (px == cx && py != cy) {
          ++drops;
          CHECK(cx == mark_x[0]);
          CHECK(cy > py);  // SVG's y grows downwards
        }
      }
      prev = cur;
    }
  }
  CHECK(drops == 1);
  CHECK(svg.find(">inf</text>") != std::string::npos);
}

TEST_CASE("plot: the held-out loss column is read and drawn as points in the loss panel", "[apps][plot]") {
  // A GPT run with --eval-every 2 over 5 steps: evaluations after steps 1, 3 and 4 (the last).
  const std::string tokens = test::tiny_tokens_file("plot_heldout"), csv = tmp("gpt.csv");
  TrainConfig c = test::tiny_gpt_config(tokens, 5);
  c.eval_every = 2;
  c.eval_windows = 4;
  c.csv = csv;
  std::ostringstream out;
  const TrainResult r = run_training(c, out);
  const RunLog log = read_step_log(csv);
  REQUIRE(log.heldout.size() == log.rows.size());
  REQUIRE(r.heldout.size() == 3);
  size_t at = 0;
  for (size_t i = 0; i < log.rows.size(); ++i) {
    if (std::isnan(log.heldout[i])) continue;
    REQUIRE(at < r.heldout.size());
    CHECK(log.rows[i].step == r.heldout[at].first);
    CHECK(std::fabs(log.heldout[i] - r.heldout[at].second) <= 1e-5 * r.heldout[at].second);  // "%.6g" in the CSV
    ++at;
  }
  CHECK(at == 3);
  const std::string svg = plot_svg({log});
  CHECK(count(svg, "<circle") == 3 + 1);  // a point per evaluation, and the legend's
  CHECK(svg.find(">held-out</text>") != std::string::npos);
  CHECK(count(svg, "stroke-dasharray=\"2 3\"") == 2);  // the series' line and the legend's

  // The same log without the column: no held-out series, no legend entry, the plain title.
  RunLog plain = log;
  plain.heldout.clear();
  const std::string before = plot_svg({plain});
  CHECK(before.find("<circle") == std::string::npos);
  CHECK(before.find("held-out") == std::string::npos);
  CHECK(before.find(">loss</text>") != std::string::npos);
  // Overlaid with a log that has it: points in that log's colour only.
  RunLog second = log;
  second.name = "bf16.csv";
  const std::string both = plot_svg({plain, second});
  CHECK(count(both, "<circle") == 3 + 1);
  CHECK(count(both, "fill=\"#2ca02c\"") == 3);
  CHECK(count(both, "fill=\"#1f77b4\"") == 0);

  // policy then heldout_loss, as a run with both writes them; a bad cell names its line.
  const std::string hand = tmp("both.csv");
  spit(hand, std::string(kStepLogHeader) + ",policy,heldout_loss\n0,0.01,1,1,2,0,,1,fp16@lr=0.01,\n" +
                 "1,0.01,1,1,1.5,0,,1,fp16@lr=0.01,1.75\n");
  const RunLog h = read_step_log(hand);
  REQUIRE(h.heldout.size() == 2);
  CHECK(std::isnan(h.heldout[0]));
  CHECK(h.heldout[1] == 1.75);
  CHECK(h.policy == std::vector<std::string>{"fp16@lr=0.01", "fp16@lr=0.01"});
  spit(hand, std::string(kStepLogHeader) + ",heldout_loss\n0,0.01,1,1,2,0,,1,low\n");
  CHECK_THROWS_WITH(read_step_log(hand), Catch::Contains("line 2") && Catch::Contains("heldout_loss 'low'"));
  spit(hand, std::string(kStepLogHeader) + ",heldout_loss,policy\n0,0.01,1,1,2,0,,1,,p\n");
  CHECK_THROWS_WITH(read_step_log(hand), Catch::Contains("not a belay step log"));
  for (const std::string& f : {tokens, csv, hand}) std::remove(f.c_str());
}

TEST_CASE("plot: a long run's lines thinned to the pixels they cross, every spike kept", "[apps][plot]") {
  // Points in separate pixel columns: kept as they are.
  std::vector<std::pair<double, double>> sparse;
  for (int i = 0; i < 10; ++i) sparse.push_back({0.5 + i, static_cast<double>(i % 3)});
  CHECK(thin_to_pixels(sparse) == sparse);
  // 1000 points in one column: its first, lowest, highest and last, in that order (the lowest
  // and highest in the order they came).
  std::vector<std::pair<double, double>> dense;
  for (int i = 0; i < 1000; ++i) dense.push_back({3.0 + i / 1000.0, i == 700 ? -5.0 : i == 400 ? 9.0 : std::sin(i)});
  dense.front().second = 1.0;
  dense.back().second = 2.0;
  const std::vector<std::pair<double, double>> want{dense[0], dense[400], dense[700], dense[999]};
  CHECK(thin_to_pixels(dense) == want);
  // The first point the lowest: three points, none twice.
  dense[0].second = -7.0;
  CHECK(thin_to_pixels(dense).size() == 3);
  CHECK(thin_to_pixels({}).empty());

  // A run of 100,000 steps with loss spikes: its SVG stays small (a polyline point per row and
  // panel was 10 MB) and still draws each spike (the spike at step 10 fixes the loss axis, so
  // the two pictures below differ only if the one at 51234 is drawn).
  RunLog log;
  log.name = "long";
  for (int64_t s = 0; s < 100000; ++s) {
    StepRow r;
    r.step = s;
    r.lr = 1e-3f;
    r.loss = s == 10 || s == 51234 ? 40.0f : 2.0f + 0.1f * static_cast<float>(std::sin(static_cast<double>(s)));
    r.grad_l2_pre_clip = r.grad_l2_post_clip = 1.0f;
    r.scaler_scale = 65536.0f;
    log.rows.push_back(r);
  }
  const std::string svg = plot_svg({log});
  CHECK(svg.size() < 1000000);
  RunLog flat = log;
  flat.rows[51234].loss = 2.0f;
  CHECK(plot_svg({flat}) != svg);  // the spike at 51234 is drawn
}
