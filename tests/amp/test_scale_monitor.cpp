// The scale diagnostics of the run summary: min, max, backoffs, growths, and the two
// warnings (repeated backoffs within one growth interval; an overflow at min_scale).
#include <catch2/catch.hpp>

#include "amp/scale_monitor.h"
#include "engine/error.h"

using namespace belay;

namespace {
StepRow row(int64_t step, float scale, bool skipped = false) {
  StepRow r;
  r.step = step;
  r.scaler_scale = scale;
  r.skipped = skipped;
  r.skip_reason = skipped ? "nonfinite_grad" : "";
  return r;
}
}  // namespace

TEST_CASE("scale monitor: min, max, backoffs and growths", "[amp][scale]") {
  ScaleMonitor m(1024.0f, 4, 1.0f);
  m.observe(row(0, 1024.0f));
  m.observe(row(1, 512.0f, true));
  m.observe(row(2, 512.0f));
  m.observe(row(3, 1024.0f));
  m.observe(row(4, 2048.0f));
  const ScaleSummary& s = m.summary();
  CHECK(s.min == 512.0f);
  CHECK(s.max == 2048.0f);
  CHECK(s.backoffs == 1);
  CHECK(s.growths == 2);
}

TEST_CASE("scale monitor: two backoffs within one growth interval warn once per episode", "[amp][scale]") {
  ScaleMonitor m(65536.0f, 10, 1.0f);
  CHECK_FALSE(m.observe(row(0, 32768.0f, true)).repeated_backoff);
  for (int s = 1; s < 9; ++s) CHECK_FALSE(m.observe(row(s, 32768.0f)).repeated_backoff);
  const auto v = m.observe(row(9, 16384.0f, true));  // 9 steps after the first: within 10
  CHECK(v.repeated_backoff);
  CHECK(v.backoffs_in_interval == 2);
  CHECK(v.interval_start == 0);
  CHECK_FALSE(m.observe(row(10, 8192.0f, true)).repeated_backoff);  // the same episode
  // A whole interval without a backoff ends the episode; the next pair warns again.
  for (int s = 11; s < 21; ++s) m.observe(row(s, 8192.0f));
  CHECK_FALSE(m.observe(row(21, 4096.0f, true)).repeated_backoff);
  CHECK(m.observe(row(22, 2048.0f, true)).repeated_backoff);
}

TEST_CASE("scale monitor: backoffs further apart than the interval do not warn", "[amp][scale]") {
  ScaleMonitor m(65536.0f, 5, 1.0f);
  CHECK_FALSE(m.observe(row(0, 32768.0f, true)).repeated_backoff);
  for (int s = 1; s < 5; ++s) m.observe(row(s, 32768.0f));
  const auto v = m.observe(row(5, 16384.0f, true));  // 5 steps later: the first has left the interval
  CHECK_FALSE(v.repeated_backoff);
  CHECK(v.backoffs_in_interval == 1);
}

TEST_CASE("scale monitor: an overflow at min_scale warns once", "[amp][scale]") {
  ScaleMonitor m(4.0f, 100, 2.0f);
  CHECK_FALSE(m.observe(row(0, 4.0f)).hit_min);
  CHECK(m.observe(row(1, 2.0f, true)).hit_min);  // backed off onto the floor
  CHECK_FALSE(m.observe(row(2, 2.0f, true)).hit_min);
  CHECK(m.summary().min == 2.0f);
}

TEST_CASE("scale monitor: a restored scale is neither a growth nor a backoff", "[amp][scale]") {
  ScaleMonitor m(65536.0f, 100, 1.0f);
  m.observe(row(0, 32768.0f, true));
  m.restart(65536.0f);
  m.observe(row(1, 65536.0f));
  CHECK(m.summary().backoffs == 1);
  CHECK(m.summary().growths == 0);
  CHECK_FALSE(m.observe(row(2, 32768.0f, true)).repeated_backoff);  // the restore began a new episode
  CHECK_THROWS_AS(ScaleMonitor(1.0f, 0, 1.0f), UsageError);
}
