#include "apps/run/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

namespace belay {

bool is_terminal(std::ostream& out) { return &out == &std::cout && isatty(STDOUT_FILENO); }

Progress::Progress(std::ostream& out, int64_t total, bool live)
    : out_(out), total_(total), live_(live), every_(total >= 10 ? total / 10 : 1) {}

std::string describe_row(const StepRow& r) {
  char buf[256];
  const double pre = std::isnan(r.grad_l2_pre_clip) ? NAN : (double)r.grad_l2_pre_clip;  // print "nan", not "-nan"
  std::snprintf(buf, sizeof buf, "%s %5lld  loss %-12.6g lr %-10.4g |g| pre %-12.6g post %-12.6g scale %-8g %s",
                r.skipped ? "SKIP" : "STEP", static_cast<long long>(r.step), (double)r.loss, (double)r.lr, pre, (double)r.grad_l2_post_clip, (double)r.scaler_scale,
                r.skip_reason.c_str());
  std::string s = buf;
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void Progress::update(const StepRow& r, int64_t skipped) {
  const int64_t done = r.step + 1;
  char buf[200];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.6g  lr %.4g  scale %g  skipped %lld",
                static_cast<long long>(done), static_cast<long long>(total_), (double)r.loss, (double)r.lr,
                (double)r.scaler_scale, static_cast<long long>(skipped));
  if (live_) {
    out_ << "\r" << buf << "\033[K" << std::flush;
    dirty_ = true;
  } else if (done % every_ == 0 || done == total_) {
    out_ << buf << "\n";
  }
}

void Progress::finish() {
  if (dirty_) out_ << "\n";
  dirty_ = false;
}

}  // namespace belay
