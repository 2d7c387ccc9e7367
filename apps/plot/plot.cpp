#include "apps/plot/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>

#include "amp/checkpoint.h"
#include "apps/plot/svg.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/text_fields.h"
#include "engine/text_file.h"

extern char** environ;

namespace belay {

namespace {

// --- axes -------------------------------------------------------------------------------

// A y axis in drawing units: the identity, or log to `base` (values <= 0 have no place on it).
struct Axis {
  int base = 0;  // 0: linear; 10 or 2: logarithmic
  double lo = 0.0, hi = 1.0;  // in drawing units
  double unit(double v) const { return base == 0 ? v : std::log(v) / std::log(static_cast<double>(base)); }
  bool usable(double v) const { return std::isfinite(v) && (base == 0 || v > 0.0); }
};

double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * p;
}

Axis make_axis(const std::vector<double>& values, int base) {
  Axis a;
  a.base = base;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values)
    if (a.usable(v)) {
      lo = std::min(lo, a.unit(v));
      hi = std::max(hi, a.unit(v));
    }
  if (!(lo <= hi)) {  // nothing to show
    a.lo = 0.0;
    a.hi = 1.0;
    return a;
  }
  if (base != 0) {
    // Whole powers, with a quarter of one kept free, so no line runs along the frame.
    a.lo = std::floor(lo - 0.25);
    a.hi = std::ceil(hi + 0.25);
    if (a.lo == a.hi) {
      a.lo -= 1.0;
      a.hi += 1.0;
    }
    return a;
  }
  if (lo == hi) {
    const double pad = lo == 0.0 ? 1.0 : std::fabs(lo) * 0.1;
    a.lo = lo - pad;
    a.hi = hi + pad;
    return a;
  }
  const double pad = (hi - lo) * 0.05;
  a.lo = lo - pad;
  a.hi = hi + pad;
  if (lo >= 0.0 && a.lo < 0.0) a.lo = 0.0;  // a non-negative quantity keeps its floor at 0
  return a;
}

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// --- the figure ---------------------------------------------------------------------------

const char* const kRunColors[] = {"#1f77b4", "#2ca02c", "#9467bd", "#8c564b"};
constexpr int kMaxLogs = 4;
const char* kGradColor = "#d62728";   // skip: nonfinite_grad
const char* kLossColor = "#ff7f0e";   // skip: nonfinite_loss
const char* kPolicyColor = "#7f3fbf";

constexpr double kWidth = 960, kLeft = 92, kRight = 28, kTop = 92, kPanelH = 150, kGap = 30, kBottom = 48;
constexpr int kPanels = 4;

struct Frame {
  double x0, y0, w, h;
  double xlo, xhi;
  Axis y;
  double px(double step) const { return x0 + (step - xlo) / (xhi - xlo) * w; }
  double py(double v) const { return y0 + h - (y.unit(v) - y.lo) / (y.hi - y.lo) * h; }
};

// One series of a log as polylines: a line breaks where a value cannot be drawn and where
// the step does not increase (the rows a rollback replays start a new line).
// Rows a rollback abandoned: some later row has the same or an earlier step.
std::vector<bool> abandoned_rows(const RunLog& log) {
  std::vector<bool> out(log.rows.size(), false);
  int64_t min_later = std::numeric_limits<int64_t>::max();
  for (size_t i = log.rows.size(); i-- > 0;) {
    out[i] = log.rows[i].step >= min_later;
    min_later = std::min(min_later, log.rows[i].step);
  }
  return out;
}

}  // namespace

std::vector<std::pair<double, double>> thin_to_pixels(const std::vector<std::pair<double, double>>& line) {
  std::vector<std::pair<double, double>> out;
  for (size_t lo = 0; lo < line.size();) {
    const double column = std::floor(line[lo].first);
    size_t hi = lo, low = lo, high = lo;  // [lo, hi): the column's points; its lowest, highest
    for (; hi < line.size() && std::floor(line[hi].first) == column; ++hi) {
      if (line[hi].second < line[low].second) low = hi;
      if (line[hi].second > line[high].second) high = hi;
    }
    size_t keep[4] = {lo, low, high, hi - 1};
    std::sort(keep, keep + 4);
    for (int k = 0; k < 4; ++k)
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(line[keep[k]]);
    lo = hi;
  }
  return out;
}

namespace {

// abandoned: draw only the rows a rollback abandoned (true) or only the others (false).
std::vector<std::vector<std::pair<double, double>>> segments(const Frame& f, const RunLog& log,
                                                             const std::function<double(const StepRow&)>& value,
                                                             bool steps_after, bool abandoned) {
  std::vector<std::vector<std::pair<double, double>>> out(1);
  const std::vector<bool> gone = abandoned_rows(log);
  int64_t prev_step = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < log.rows.size(); ++i) {
    const StepRow& r = log.rows[i];
    if (gone[i] != abandoned) continue;  // the other set: the line runs on across it
    const double v = value(r);
    if (r.step <= prev_step || !f.y.usable(v)) {
      if (!out.back().empty()) out.emplace_back();
    }
    prev_step = r.step;
    if (!f.y.usable(v)) continue;
    const double x = f.px(static_cast<double>(r.step)), y = f.py(v);
    // A value that holds until the next row (the scale): a horizontal run, then the jump.
    if (steps_after && !out.back().empty()) out.back().push_back({x, out.back().back().second});
    out.back().push_back({x, y});
  }
  return out;
}

void draw_frame(Svg& svg, const Frame& f, const std::string& title, bool x_labels) {
  const SvgStyle grid{"#e3e3e3", 1.0, ""};
  // y ticks
  if (f.y.base == 0) {
    const double step = nice_step((f.y.hi - f.y.lo) / 4.0);
    for (double t = std::ceil(f.y.lo / step) * step; t <= f.y.hi + step * 1e-9; t += step) {
      const double y = f.py(t);
      svg.line(f.x0, y, f.x0 + f.w, y, grid);
      svg.text(f.x0 - 6, y + 4, short_number(std::fabs(t) < step * 1e-9 ? 0.0 : t), 10, "end");
    }
  } else {
    const int lo = static_cast<int>(f.y.lo), hi = static_cast<int>(f.y.hi);
    const int every = std::max(1, (hi - lo + 5) / 6);
    for (int k = lo; k <= hi; ++k) {
      const double y = f.y0 + f.h - (k - f.y.lo) / (f.y.hi - f.y.lo) * f.h;
      if ((k - lo) % every != 0) continue;
      svg.line(f.x0, y, f.x0 + f.w, y, grid);
      if (f.y.base == 10 && k >= -3 && k <= 2)
        svg.text(f.x0 - 6, y + 4, short_number(std::pow(10.0, k)), 10, "end");
      else
        svg.power_text(f.x0 - 6, y + 4, f.y.base == 10 ? "10" : "2", k, 10, "end");
    }
  }
  // x ticks
  const double xstep = std::max(1.0, nice_step((f.xhi - f.xlo) / 8.0));
  for (double t = std::ceil(f.xlo / xstep) * xstep; t <= f.xhi + 1e-9; t += xstep) {
    const double x = f.px(t);
    svg.line(x, f.y0, x, f.y0 + f.h, grid);
    if (x_labels) svg.text(x, f.y0 + f.h + 15, short_number(t), 10, "middle");
  }
  svg.rect(f.x0, f.y0, f.w, f.h, SvgStyle{"#555", 1.0, ""});
  svg.text(f.x0, f.y0 - 6, title, 12, "start", "#111");
}

// A heldout_loss cell: empty on a row without an evaluation (NaN here), else a number as
// the trainer printed it ("%.6g"; "nan" and "inf" included: a diverged model's loss).
double parse_heldout(const std::string& cell, const std::string& where) {
  if (cell.empty()) return NAN;
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  if (*end != '\0') throw UsageError(where + ": heldout_loss '" + cell + "' is not a number");
  return v;
}

}  // namespace

RunLog read_step_log(const std::string& path) {
  std::ifstream in = open_text_file(path, "step log");
  RunLog log;
  log.name = path;
  std::string line;
  if (!read_text_line(in, line)) throw UsageError("step log '" + path + "' is empty");
  const std::string header = kStepLogHeader;
  const bool policy = line == header + ",policy" || line == header + ",policy,heldout_loss";
  const bool heldout = line == header + ",heldout_loss" || line == header + ",policy,heldout_loss";
  if (line != header && !policy && !heldout)
    throw UsageError("'" + path + "' is not a belay step log: its header is not " + header +
                     "[,policy][,heldout_loss]");
  const size_t columns = 8 + policy + heldout;
  int64_t line_no = 1;
  while (read_text_line(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::vector<std::string> f = split_fields(line);
    const std::string where = "step log '" + path + "' line " + std::to_string(line_no);
    if (f.size() != columns)
      throw UsageError(where + ": " + std::to_string(f.size()) + " fields, expected " + std::to_string(columns));
    StepRow r;
    const std::optional<int64_t> step = parse_count(f[0]);
    if (!step) throw UsageError(where + ": step '" + f[0] + "' is not a count");
    r.step = *step;
    // As the log wrote them: FP32 values ("inf" and "nan" included; one past FP32's range
    // reads as inf), parsed as checkpoints parse theirs.
    r.lr = parse_exact_float(f[1], where);
    r.grad_l2_pre_clip = parse_exact_float(f[2], where);
    r.grad_l2_post_clip = parse_exact_float(f[3], where);
    r.loss = parse_exact_float(f[4], where);
    if (f[5] != "0" && f[5] != "1") throw UsageError(where + ": skipped must be 0 or 1, got '" + f[5] + "'");
    r.skipped = f[5] == "1";
    r.skip_reason = f[6];
    r.scaler_scale = parse_exact_float(f[7], where);
    log.rows.push_back(r);
    if (policy) log.policy.push_back(f[8]);
    if (heldout) log.heldout.push_back(parse_heldout(f.back(), where));
  }
  if (log.rows.empty()) throw UsageError("step log '" + path + "' has no rows");
  return log;
}

namespace {

using Frames = std::array<Frame, kPanels>;

// The four panels' frames: one step axis for all, each panel's value axis from every log.
Frames make_frames(const std::vector<RunLog>& logs) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo;
  std::vector<double> loss, norms, scale, lr;
  for (const RunLog& log : logs)
    for (const StepRow& r : log.rows) {
      xlo = std::min(xlo, static_cast<double>(r.step));
      xhi = std::max(xhi, static_cast<double>(r.step));
      loss.push_back(r.loss);
      norms.push_back(r.grad_l2_pre_clip);
      norms.push_back(r.grad_l2_post_clip);
      scale.push_back(r.scaler_scale);
      lr.push_back(r.lr);
    }
  for (const RunLog& log : logs) loss.insert(loss.end(), log.heldout.begin(), log.heldout.end());
  if (xlo == xhi) {
    xlo -= 1.0;
    xhi += 1.0;
  }
  // The loss on a log axis when it is positive throughout (it usually spans decades).
  bool loss_positive = true;
  for (double v : loss)
    if (std::isfinite(v) && v <= 0.0) loss_positive = false;
  const double plot_w = kWidth - kLeft - kRight;
  auto frame = [&](int i, Axis y) {
    return Frame{kLeft, kTop + i * (kPanelH + kGap), plot_w, kPanelH, xlo, xhi, y};
  };
  return {frame(0, make_axis(loss, loss_positive ? 10 : 0)), frame(1, make_axis(norms, 10)),
          frame(2, make_axis(scale, 2)), frame(3, make_axis(lr, 0))};
}

// Skipped steps and policy changes: vertical marks through every panel, under the lines.
void draw_marks(Svg& svg, const Frames& frames, const std::vector<RunLog>& logs) {
  for (size_t li = 0; li < logs.size(); ++li) {
    const RunLog& log = logs[li];
    for (size_t i = 0; i < log.rows.size(); ++i) {
      const StepRow& r = log.rows[i];
      const bool policy_change = !log.policy.empty() && i > 0 && log.policy[i] != log.policy[i - 1];
      if (!r.skipped && !policy_change) continue;
      const double x = frames[0].px(static_cast<double>(r.step));
      SvgStyle mark{r.skip_reason == "nonfinite_loss" ? kLossColor : kGradColor, 1.5, li ? "3 3" : "", "none", 0.75};
      if (policy_change && !r.skipped) mark = SvgStyle{kPolicyColor, 1.5, "6 3", "none", 0.9};
      for (const Frame& f : frames) svg.line(x, f.y0, x, f.y0 + f.h, mark);
      if (policy_change)
        svg.text(x + 3, frames[0].y0 + 12, "policy: " + log.policy[i], 10, "start", kPolicyColor);
      const bool after_nonfinite = i > 0 && !std::isfinite(log.rows[i - 1].grad_l2_pre_clip);
      if (!std::isfinite(r.grad_l2_pre_clip) && !after_nonfinite)  // no place on the axis: say what it was
        svg.text(x + 3, frames[1].y0 + 12, std::isnan(r.grad_l2_pre_clip) ? "nan" : "inf", 10, "start", mark.stroke);
    }
  }
}

// The held-out loss of a log: a point per evaluation and a dashed line through them (broken
// where a rollback replays steps), in the log's colour; rows a rollback abandoned are faint.
void draw_heldout(Svg& svg, const Frame& f, const RunLog& log, const std::string& color) {
  const std::vector<bool> gone = abandoned_rows(log);
  for (bool abandoned : {true, false}) {
    const double opacity = abandoned ? 0.3 : 1.0;
    std::vector<std::vector<std::pair<double, double>>> lines(1);
    int64_t prev_step = std::numeric_limits<int64_t>::min();
    for (size_t i = 0; i < log.heldout.size(); ++i) {
      if (gone[i] != abandoned || !f.y.usable(log.heldout[i])) continue;
      const int64_t step = log.rows[i].step;
      if (step <= prev_step && !lines.back().empty()) lines.emplace_back();
      prev_step = step;
      lines.back().push_back({f.px(static_cast<double>(step)), f.py(log.heldout[i])});
    }
    for (const auto& line : lines) {
      svg.polyline(line, SvgStyle{color, 1.3, "2 3", "none", opacity});
      for (const auto& [x, y] : line) svg.circle(x, y, 3.0, SvgStyle{color, 1.0, "", color, opacity});
    }
  }
}

// The series, a color per log.
void draw_series(Svg& svg, const Frames& frames, const std::vector<RunLog>& logs) {
  for (size_t li = 0; li < logs.size(); ++li) {
    const RunLog& log = logs[li];
    const std::string color = kRunColors[li];
    const SvgStyle solid{color, 1.6, ""}, dashed{color, 1.3, "5 3"};
    // Rows a rollback abandoned are drawn faint, under the rows that replaced them.
    auto draw = [&](const Frame& f, const std::function<double(const StepRow&)>& value, const SvgStyle& st,
                    bool steps_after) {
      SvgStyle faint = st;
      faint.opacity = 0.3;
      for (const auto& seg : segments(f, log, value, steps_after, true)) svg.polyline(thin_to_pixels(seg), faint);
      for (const auto& seg : segments(f, log, value, steps_after, false)) svg.polyline(thin_to_pixels(seg), st);
    };
    draw(frames[0], [](const StepRow& r) { return static_cast<double>(r.loss); }, solid, false);
    draw(frames[1], [](const StepRow& r) { return static_cast<double>(r.grad_l2_pre_clip); }, solid, false);
    draw(frames[1], [](const StepRow& r) { return r.skipped ? NAN : static_cast<double>(r.grad_l2_post_clip); }, dashed,
         false);
    draw(frames[2], [](const StepRow& r) { return static_cast<double>(r.scaler_scale); }, solid, true);
    draw(frames[3], [](const StepRow& r) { return static_cast<double>(r.lr); }, solid, true);
    if (!log.heldout.empty()) draw_heldout(svg, frames[0], log, color);
  }
}

// The legend: one entry per log, then the held-out sample and the skip reasons; an entry
// that would pass the right edge starts a second line (there is room for two above the panels).
void draw_legend(Svg& svg, const std::vector<RunLog>& logs) {
  double lx = kLeft, ly = 22;
  svg.text(kLeft, ly, logs.size() == 1 ? "belay: " + logs[0].name : "belay: " + std::to_string(logs.size()) + " runs", 14,
           "start", "#111");
  ly += 22;
  auto place = [&](double width) {  // where the next entry of this width starts
    if (lx > kLeft && lx + width > kWidth - kRight) {
      lx = kLeft;
      ly += 16;
    }
  };
  for (size_t li = 0; li < logs.size(); ++li) {
    int64_t skipped = 0;
    for (const StepRow& r : logs[li].rows) skipped += r.skipped;
    const std::string label = logs[li].name + " (" + std::to_string(logs[li].rows.size()) + " rows, " +
                              std::to_string(skipped) + " skipped)";
    place(27 + 6.5 * static_cast<double>(label.size()));
    svg.line(lx, ly - 4, lx + 22, ly - 4, SvgStyle{kRunColors[li], 2.5, ""});
    svg.text(lx + 27, ly, label, 11);
    lx += 27 + 6.5 * static_cast<double>(label.size()) + 18;
  }
  if (std::any_of(logs.begin(), logs.end(), [](const RunLog& l) { return !l.heldout.empty(); })) {
    // The held-out loss: drawn in each log's colour; the legend's sample in grey.
    place(27 + 6.5 * 8);
    svg.line(lx, ly - 4, lx + 22, ly - 4, SvgStyle{"#555", 1.3, "2 3"});
    svg.circle(lx + 11, ly - 4, 3.0, SvgStyle{"#555", 1.0, "", "#555"});
    svg.text(lx + 27, ly, "held-out", 11);
    lx += 27 + 6.5 * 8 + 18;
  }
  for (const auto& [color, reason] : {std::pair<const char*, const char*>{kGradColor, "skip: nonfinite_grad"},
                                      {kLossColor, "skip: nonfinite_loss"}}) {
    place(5 + 6.5 * 20);
    svg.line(lx, ly - 10, lx, ly + 2, SvgStyle{color, 2, ""});
    svg.text(lx + 5, ly, reason, 11);
    lx += 5 + 6.5 * 20 + 16;
  }
}

}  // namespace

std::string plot_svg(const std::vector<RunLog>& logs) {
  if (logs.empty() || logs.size() > kMaxLogs) throw UsageError("plot: give 1 to 4 step logs");
  const Frames frames = make_frames(logs);
  const double height = kTop + kPanels * kPanelH + (kPanels - 1) * kGap + kBottom;
  const double plot_w = kWidth - kLeft - kRight;
  Svg svg(kWidth, height);
  const bool heldout = std::any_of(logs.begin(), logs.end(), [](const RunLog& l) { return !l.heldout.empty(); });
  const char* titles[kPanels] = {heldout ? "loss: training (solid), held-out (points, dotted)" : "loss", "gradient L2 norm: pre-clip (solid), post-clip (dashed)",
                                 "loss scale (after the step's update)", "learning rate"};
  for (int i = 0; i < kPanels; ++i) draw_frame(svg, frames[i], titles[i], i == kPanels - 1);
  svg.text(kLeft + plot_w / 2, height - 12, "step", 11, "middle");
  draw_marks(svg, frames, logs);
  draw_series(svg, frames, logs);
  draw_legend(svg, logs);
  return svg.str();
}

namespace {

std::string extension_of(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  std::string lower;
  for (char c : ext) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

// The rsvg-convert on the PATH, or "" when there is none.
std::string find_rsvg_convert() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/rsvg-convert";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

void write_plot(const std::vector<RunLog>& logs, const std::string& out) {
  const std::string ext = extension_of(out);
  if (ext != ".svg" && ext != ".png") throw UsageError("plot output '" + out + "' must end in .svg or .png");
  std::string rsvg;
  if (ext == ".png") {
    rsvg = find_rsvg_convert();
    if (rsvg.empty())
      throw Error("writing a PNG needs rsvg-convert on the PATH (Debian: apt-get install librsvg2-bin); "
                  "or write an .svg");
  }
  const std::string svg = plot_svg(logs);
  // Written beside the target and renamed over it: a reader never sees half a picture.
  AtomicFile file(out);
  if (ext == ".svg") {
    file.write(svg);
  } else {
    // rsvg-convert writes the PNG into the temporary by name, from an SVG beside it.
    const std::string tmp_svg = file.temp_path() + ".svg";
    {
      std::ofstream svg_file(tmp_svg, std::ios::binary);
      svg_file << svg;
      if (!svg_file.flush()) {
        std::remove(tmp_svg.c_str());
        throw Error("cannot write '" + out + "': writing its SVG source failed");
      }
    }
    std::vector<std::string> args{rsvg, "--format", "png", "--output", file.temp_path(), tmp_svg};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int status = 0;
    const int spawned = ::posix_spawn(&pid, rsvg.c_str(), nullptr, nullptr, argv.data(), environ);
    const bool ran = spawned == 0 && ::waitpid(pid, &status, 0) == pid;
    std::remove(tmp_svg.c_str());
    if (!ran || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw Error("rsvg-convert could not render '" + out + "'" +
                  (spawned != 0 ? std::string(": ") + std::strerror(spawned) : std::string()));
  }
  file.commit();
}

int run_plot(const std::vector<std::string>& csvs, std::string out, std::ostream& os) {
  if (csvs.empty() || csvs.size() > kMaxLogs) throw UsageError("plot: give 1 to 4 step logs (CSV files)");
  if (out.empty()) {
    const std::filesystem::path p(csvs[0]);
    out = (p.extension() == ".csv" ? p.parent_path() / p.stem() : p).string() + ".svg";
  }
  std::vector<RunLog> logs;
  for (const std::string& c : csvs) logs.push_back(read_step_log(c));  // every file checked before writing
  write_plot(logs, out);
  os << "wrote " << out << "\n";
  return 0;
}

}  // namespace belay
