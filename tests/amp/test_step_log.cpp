// The step log: exact header, one flushed row per step, resume truncation; the skip monitor.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "amp/step_log.h"
#include "engine/error.h"
#include "files.h"

using namespace belay;

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string temp_path(const char* name) { return belay::test::temp_path("step_log", name); }
}  // namespace

TEST_CASE("the log has exactly the canonical header and one row per step", "[amp][log]") {
  const std::string path = temp_path("log.csv");
  {
    StepLogWriter log(path);
    StepRow r;
    r.step = 0;
    r.lr = 0.01f;
    r.grad_l2_pre_clip = 1.5f;
    r.grad_l2_post_clip = 1.0f;
    r.loss = 0.25f;
    r.scaler_scale = 65536.0f;
    log.write(r);
    // Flushed: readable before the writer closes.
    CHECK(read_file(path) ==
          "step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale\n"
          "0,0.00999999978,1.5,1,0.25,0,,65536\n");
    r.step = 1;
    r.skipped = true;
    r.skip_reason = "nonfinite_grad";
    r.grad_l2_pre_clip = -NAN;
    r.grad_l2_post_clip = 0.0f;
    r.scaler_scale = 32768.0f;
    log.write(r);
  }
  const std::string text = read_file(path);
  CHECK(text.find("1,0.00999999978,nan,0,0.25,1,nonfinite_grad,32768\n") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("resuming a log keeps the rows up to the checkpoint's step", "[amp][log]") {
  const std::string path = temp_path("resume.csv");
  {
    StepLogWriter log(path);
    for (int s = 0; s < 5; ++s) {
      StepRow r;
      r.step = s;
      log.write(r);
    }
  }
  {
    StepLogWriter log(path, 2);
    StepRow r;
    r.step = 3;
    r.loss = 7.0f;
    log.write(r);
  }
  std::istringstream lines(read_file(path));
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  REQUIRE(all.size() == 5);  // header + steps 0, 1, 2 kept + the new step 3
  CHECK(all[3].rfind("2,", 0) == 0);
  CHECK(all[4].rfind("3,", 0) == 0);
  CHECK(all[4].find(",7,") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("resuming reads a CRLF log as belay plot does, and refuses a row whose step is not a count", "[amp][log]") {
  const std::string path = temp_path("resume_crlf.csv");
  const std::string header = kStepLogHeader;
  {
    std::ofstream out(path, std::ios::binary);
    out << header << "\r\n0,0.001,1,1,2.5,0,,1\r\n1,0.001,1,1,2.25,0,,1\r\n2,0.001,1,1,2,0,,1\r\n";
  }
  { StepLogWriter log(path, 1); }
  CHECK(read_file(path) == header + "\n0,0.001,1,1,2.5,0,,1\n1,0.001,1,1,2.25,0,,1\n");

  // A row that is not one of belay's (its step "x", "+1" or " 1") stops the resume and keeps the log as it was.
  for (const char* bad : {"x", "+1", " 1"}) {
    const std::string text = header + "\n0,0.001,1,1,2.5,0,,1\n" + bad + ",0.001,1,1,2.25,0,,1\n";
    {
      std::ofstream out(path, std::ios::binary);
      out << text;
    }
    try {
      StepLogWriter log(path, 5);
      FAIL("resumed over a row whose step is '" << bad << "'");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()) == "step log '" + path + "' line 3: step '" + bad +
                                         "' is not a count: mend the log or use another --csv");
    }
    CHECK(read_file(path) == text);
  }
  std::remove(path.c_str());
}

TEST_CASE("an unwritable log path is a usage error and leaves nothing", "[amp][log]") {
  CHECK_THROWS_AS(StepLogWriter("/nonexistent-dir/x/run.csv"), UsageError);
}

TEST_CASE("the skip monitor: rolling rate, one alert per crossing, stop after patience", "[amp][log]") {
  SkipMonitorOptions o;
  o.window = 4;
  o.alert_rate = 0.3;
  o.max_rate = 0.5;
  o.patience = 2;
  SkipMonitor m(o);
  auto v = m.observe(false);
  CHECK(v.rate == 0.0);
  CHECK_FALSE(v.alert);
  v = m.observe(true);  // 1/2
  CHECK(v.rate == 0.5);
  CHECK(v.alert);
  CHECK_FALSE(v.stop);  // above max for 0 steps (0.5 is not above 0.5)
  v = m.observe(true);  // 2/3
  CHECK_FALSE(v.alert);  // still above: no second alert
  CHECK_FALSE(v.stop);   // 1 step above max
  v = m.observe(true);   // 3/4
  CHECK(v.stop);         // 2 consecutive steps above max
  v = m.observe(false);  // window slides: 3/4 (drops the first false)
  CHECK(v.rate == 0.75);
  v = m.observe(false);  // 2/4
  v = m.observe(false);  // 1/4
  CHECK(v.rate == 0.25);
  v = m.observe(true);   // 1/4 ... window [f, f, f, t]
  CHECK(v.rate == 0.25);
  CHECK_FALSE(v.alert);
}

TEST_CASE("skip monitor settings are validated", "[amp][log]") {
  SkipMonitorOptions o;
  o.window = 0;
  CHECK_THROWS_AS(SkipMonitor(o), UsageError);
  o.window = 10;
  o.patience = 0;
  CHECK_THROWS_AS(SkipMonitor(o), UsageError);
}
