#include "apps/run/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

namespace belay {

bool is_terminal(std::ostream& out) { return &out == &std::cout && isatty(STDOUT_FILENO); }

Progress::Progress(std::ostream& out, int64_t total, bool live, int64_t tokens_per_step)
    : out_(out),
      total_(total),
      live_(live),
      every_(total >= 10 ? total / 10 : 1),
      tokens_per_step_(tokens_per_step),
      t0_(std::chrono::steady_clock::now()) {}

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
  char buf[240];
  int n = std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.6g  lr %.4g  scale %g  skipped %lld",
                        static_cast<long long>(done), static_cast<long long>(total_), (double)r.loss, (double)r.lr,
                        (double)r.scaler_scale, static_cast<long long>(skipped));
  ++steps_seen_;
  if (tokens_per_step_ > 0) {  // over the steps this process ran (a resumed run counts from its start)
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "  %.4g tokens/s",
                  static_cast<double>(steps_seen_ * tokens_per_step_) / std::max(seconds, 1e-9));
  }
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
