#include "amp/step_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/text_fields.h"
#include "engine/text_file.h"

namespace belay {

const char* const kStepLogHeader = "step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale";

static std::string num(float x) {
  if (std::isnan(x)) return "nan";  // never "-nan": one spelling for every reader
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));  // round-trips an FP32
  return buf;
}

std::string format_step_row(const StepRow& r) {
  return std::to_string(r.step) + "," + num(r.lr) + "," + num(r.grad_l2_pre_clip) + "," + num(r.grad_l2_post_clip) +
         "," + num(r.loss) + "," + (r.skipped ? "1" : "0") + "," + r.skip_reason + "," + num(r.scaler_scale);
}

std::string nonfinite_tensors(const std::vector<TensorCensus>& census) {
  std::string first;
  int64_t more = 0;
  for (const TensorCensus& c : census) {
    if (c.nonfinite == 0) continue;
    if (first.empty()) first = c.name;
    else ++more;
  }
  if (first.empty()) return "";
  return more == 0 ? first : first + "(+" + std::to_string(more) + " more)";
}

StepLogWriter::StepLogWriter(const std::string& path, int64_t keep_rows_through, std::vector<std::string> extra_columns)
    : path_(path), extra_columns_(std::move(extra_columns)) {
  std::string columns = kStepLogHeader;
  for (const std::string& c : extra_columns_) columns += "," + c;
  std::vector<std::string> kept;
  if (keep_rows_through >= 0) {
    // Read as belay plot reads it (a CRLF log's '\r' dropped: the kept rows are written back
    // with '\n'); a row whose step is not a count is refused, not kept as step 0.
    std::ifstream in(path, std::ios::binary);
    std::string line;
    int64_t line_no = 0;
    while (read_text_line(in, line)) {
      if (++line_no == 1) {
        if (line.rfind(kStepLogHeader, 0) == 0) {
          if (line != columns)
            throw UsageError("step log '" + path + "' has the columns " + line + ", this run writes " + columns +
                             ": use another --csv");
        } else {
          throw UsageError("step log '" + path + "' does not start with the belay header");
        }
        continue;
      }
      if (line.empty()) continue;
      const std::string first = line.substr(0, line.find(','));
      const std::optional<int64_t> step = parse_count(first);
      if (!step)
        throw UsageError("step log '" + path + "' line " + std::to_string(line_no) + ": step '" + first +
                         "' is not a count: mend the log or use another --csv");
      if (*step <= keep_rows_through) kept.push_back(line);
    }
  }
  // Rewritten through a temporary file, so a failure never leaves a half-written log.
  std::string text = columns + "\n";
  for (const std::string& line : kept) text += line + "\n";
  write_file_atomically(path, text);
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw UsageError("cannot append to step log '" + path + "': " + std::strerror(errno));
}

StepLogWriter::~StepLogWriter() { close(); }

void StepLogWriter::write(const StepRow& row, const std::vector<std::string>& extra) {
  if (!file_) throw Error("step log '" + path_ + "' is closed");
  if (extra.size() != extra_columns_.size())
    throw Error("step log '" + path_ + "': " + std::to_string(extra.size()) + " extra values for " +
                std::to_string(extra_columns_.size()) + " extra columns");
  std::string line = format_step_row(row);
  for (size_t i = 0; i < extra.size(); ++i) {
    if (extra[i].find_first_of(",\n") != std::string::npos || (extra_columns_[i] == "policy" && extra[i].empty()))
      throw Error("step log '" + path_ + "': a " + extra_columns_[i] + " value must be non-empty, without commas");
    line += "," + extra[i];
  }
  line += "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw Error("writing step log '" + path_ + "' failed: " + std::strerror(errno));
}

void StepLogWriter::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

SkipMonitor::SkipMonitor(SkipMonitorOptions options) : options_(options) {
  if (options_.window < 1) throw UsageError("skip window must be >= 1");
  if (options_.patience < 1) throw UsageError("skip patience must be >= 1");
  if (!(options_.alert_rate >= 0.0 && options_.alert_rate <= 1.0)) throw UsageError("skip alert rate must be in [0, 1]");
  if (options_.max_rate > 1.0) throw UsageError("max skip rate must be in [0, 1]");
}

SkipMonitor::Verdict SkipMonitor::observe(bool skipped) {
  recent_.push_back(skipped);
  skips_in_window_ += skipped;
  if (static_cast<int64_t>(recent_.size()) > options_.window) {
    skips_in_window_ -= recent_.front();
    recent_.pop_front();
  }
  Verdict v;
  v.rate = static_cast<double>(skips_in_window_) / static_cast<double>(recent_.size());
  const bool above_alert = v.rate > options_.alert_rate;
  v.alert = above_alert && !alerting_;
  alerting_ = above_alert;
  if (options_.max_rate >= 0.0 && v.rate > options_.max_rate) {
    v.stop = ++above_max_for_ >= options_.patience;
  } else {
    above_max_for_ = 0;
  }
  return v;
}

}  // namespace belay
