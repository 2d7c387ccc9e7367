// The benchmark harness: warm-up, repetitions, median and spread, results as JSON.
// Deliberately small: a benchmark is a lambda timed with steady_clock; everything else
// (bytes, flops, checks) is the caller's, so every number in the report says what it is.
// Timing lives here and only here: tests never time anything.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace belay::bench {

using Json = nlohmann::ordered_json;

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  double spread = 0.0;  // (p75 - p25) / median: the relative interquartile range
  int reps = 0;
};

// The clock: wall time (steady_clock) unless belay_bench --cpu-time asked for this thread's
// CPU time, which leaves out the time the thread waited for a core: on a shared machine
// running other jobs, the only fair measure. Only for one thread (the others' time is not
// counted): main.cpp refuses it otherwise.
inline bool& thread_cpu_clock() {
  static bool on = false;
  return on;
}

inline double now_ms() {
  if (thread_cpu_clock()) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(ms.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, ms.size() - 1);
    return ms[lo] + (pos - static_cast<double>(lo)) * (ms[hi] - ms[lo]);
  };
  Timing t;
  t.reps = static_cast<int>(ms.size());
  t.median_ms = quantile(0.5);
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.spread = t.median_ms > 0 ? (quantile(0.75) - quantile(0.25)) / t.median_ms : 0.0;
  return t;
}

// Runs `body` warmup times untimed, then reps times timed. `before` runs untimed ahead of
// each repetition (resetting state), `body` is what is measured.
inline Timing time_it(int warmup, int reps, const std::function<void()>& body,
                      const std::function<void()>& before = nullptr) {
  for (int i = 0; i < warmup; ++i) {
    if (before) before();
    body();
  }
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    if (before) before();
    const double t0 = now_ms();
    body();
    ms.push_back(now_ms() - t0);
  }
  return summarize(std::move(ms));
}

// Two contenders timed ALTERNATELY (a, b, a, b, ...): drift on a shared machine hits both
// alike, so their ratio is fair even when the absolute times move.
inline std::pair<Timing, Timing> time_pair(int warmup, int reps, const std::function<void()>& a,
                                           const std::function<void()>& b) {
  for (int i = 0; i < warmup; ++i) {
    a();
    b();
  }
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    a();
    ta.push_back(now_ms() - t0);
    t0 = now_ms();
    b();
    tb.push_back(now_ms() - t0);
  }
  return {summarize(std::move(ta)), summarize(std::move(tb))};
}

inline Json to_json(const Timing& t) {
  return Json{{"median_ms", t.median_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms}, {"iqr_rel", t.spread},
              {"reps", t.reps}};
}

// A benchmark's result check failed: the run reports it and exits non-zero, so a fast
// wrong kernel never lands in a results file as a good number.
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void check_failed(const std::string& what) { throw CheckFailure("check failed: " + what); }
inline void require(bool ok, const std::string& what) {
  if (!ok) check_failed(what);
}

// Options every section reads: `quick` shrinks sizes and repetitions (a smoke run).
struct Options {
  bool quick = false;
  bool long_rows = false;  // --long: the rows of minutes (the gpt section's GPT-2 small at context 1024)
  int threads = 0;  // 0: OpenMP's default
};

}  // namespace belay::bench
