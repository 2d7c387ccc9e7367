#include "amp/census_log.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "engine/error.h"

namespace belay {

const char* const kCensusHeader =
    "step,tensor,numel,nonfinite,amax,underflow_to_zero,subnormal,zeros,headroom_bits,skipped,scale";

namespace {
std::string num(double x, const char* fmt = "%.9g") {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

// 2^k when the scale is a power of two (as the scaler keeps it), else the number.
std::string scale_text(float scale) {
  int e = 0;
  const float m = std::frexp(scale, &e);
  return m == 0.5f ? "2^" + std::to_string(e - 1) : num(scale, "%g");
}
}  // namespace

std::string format_census_row(int64_t step, const TensorCensus& c, DType format, bool skipped, float scale) {
  return std::to_string(step) + "," + c.name + "," + std::to_string(c.numel) + "," + std::to_string(c.nonfinite) + "," +
         num(c.amax) + "," + std::to_string(c.underflow) + "," + std::to_string(c.subnormal) + "," +
         std::to_string(c.zeros) + "," + num(c.headroom_bits(format), "%.4f") + "," + (skipped ? "1" : "0") + "," +
         num(scale);
}

std::string cast_row_name(const std::string& site) { return "cast:" + site; }

CensusLogWriter::CensusLogWriter(const std::string& path, int64_t every, DType format)
    : path_(path), every_(every), format_(format) {
  if (every_ < 1) throw UsageError("--census-every must be >= 1, got " + std::to_string(every_));
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw UsageError("cannot write census file '" + path + "': " + std::strerror(errno));
  const std::string header = std::string(kCensusHeader) + "\n";
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() || std::fflush(file_) != 0)
    throw UsageError("writing census file '" + path + "' failed: " + std::strerror(errno));
}

CensusLogWriter::~CensusLogWriter() { close(); }

bool CensusLogWriter::write(const StepRow& row, float scale) {
  if (!file_) throw Error("census file '" + path_ + "' is closed");
  if (!records(row) || row.census.empty()) return false;
  std::string text;
  for (const TensorCensus& c : row.census) text += format_census_row(row.step, c, format_, row.skipped, scale) + "\n";
  for (TensorCensus c : row.cast_census) {
    c.name = cast_row_name(c.name);
    text += format_census_row(row.step, c, format_, row.skipped, scale) + "\n";
  }
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    throw Error("writing census file '" + path_ + "' failed: " + std::strerror(errno));
  return true;
}

void CensusLogWriter::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

std::string tensor_class(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const bool field_start = i == 0 || name[i - 1] == '.';
    size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (field_start && j > i && (j == name.size() || name[j] == '.')) {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}

void CensusSummary::observe(const StepRow& row, float scale) {
  observe_casts(row);
  if (row.skipped || row.census.empty()) return;
  if (first_step_ < 0) first_step_ = row.step;
  last_step_ = row.step;
  for (const TensorCensus& c : row.census) {
    const double h = c.headroom_bits(format_);
    const double u = c.numel > 0 ? static_cast<double>(c.underflow) / static_cast<double>(c.numel) : 0.0;
    for (Worst* w : {&classes_[tensor_class(c.name)], &all_}) {
      if (h < w->headroom) *w = Worst{h, c.name, row.step, w->underflow, w->underflow_tensor, w->underflow_step,
                                      w->underflow_scale};
      if (u > w->underflow) {
        w->underflow = u;
        w->underflow_tensor = c.name;
        w->underflow_step = row.step;
        w->underflow_scale = scale;
      }
    }
  }
}

// A cast's loss does not depend on the loss scale: skipped steps count too.
void CensusSummary::observe_casts(const StepRow& row) {
  for (const TensorCensus& c : row.cast_census) {
    const double h = c.headroom_bits(format_);
    const double u = c.numel > 0 ? static_cast<double>(c.underflow) / static_cast<double>(c.numel) : 0.0;
    for (CastWorst* w : {&cast_classes_[tensor_class(c.name)], &cast_all_}) {
      if (h < w->headroom) {
        w->headroom = h;
        w->headroom_site = c.name;
      }
      if (u > w->underflow) {
        w->underflow = u;
        w->underflow_site = c.name;
      }
      if (c.nonfinite > w->nonfinite) {
        w->nonfinite = c.nonfinite;
        w->nonfinite_site = c.name;
        w->nonfinite_step = row.step;
      }
    }
  }
}

// One line per cast class, then one line of advice: an overflow first (the op class to keep
// in FP32), else the most flushed, else the least headroom.
std::vector<std::string> CensusSummary::cast_lines() const {
  std::vector<std::string> out;
  if (cast_classes_.empty()) return out;
  const std::string fmt = dtype_name(format_);
  for (const auto& [cls, w] : cast_classes_)
    out.push_back("census cast " + cls + ": least headroom " + num(w.headroom, "%.1f") + " bits (" + w.headroom_site +
                  "); most flushed to zero " + num(100.0 * w.underflow, "%.3g") + "%" +
                  (w.underflow > 0.0 ? " (" + w.underflow_site + ")" : "") +
                  (w.nonfinite > 0 ? "; " + std::to_string(w.nonfinite) + " values non-finite after the cast (" +
                                         w.nonfinite_site + ")"
                                   : ""));
  const CastWorst& a = cast_all_;
  if (a.nonfinite > 0)
    out.push_back("census cast advice: " + std::to_string(a.nonfinite) + " values of " + a.nonfinite_site +
                  " were non-finite after the cast to " + fmt + " (step " + std::to_string(a.nonfinite_step) +
                  "): keep that op class in FP32 (--fp32-ops) or train in bf16");
  else if (a.underflow > 0.0)
    out.push_back("census cast advice: " + num(100.0 * a.underflow, "%.3g") + "% of " + a.underflow_site +
                  " flushes to zero when cast to " + fmt + "; nothing overflowed (least headroom " +
                  num(a.headroom, "%.1f") + " bits, " + a.headroom_site + ")");
  else
    out.push_back("census cast advice: the forward's casts to " + fmt + " flushed nothing and the least headroom was " +
                  num(a.headroom, "%.1f") + " bits (" + a.headroom_site + ")");
  return out;
}

std::vector<std::string> CensusSummary::lines() const {
  std::vector<std::string> out = grad_lines();
  for (std::string& line : cast_lines()) out.push_back(std::move(line));
  return out;
}

std::vector<std::string> CensusSummary::grad_lines() const {
  std::vector<std::string> out;
  if (first_step_ < 0) return out;
  const std::string fmt = dtype_name(format_);
  for (const auto& [cls, w] : classes_)
    out.push_back("census " + cls + ": least headroom " + num(w.headroom, "%.1f") + " bits (" + w.headroom_tensor +
                  ", step " + std::to_string(w.headroom_step) + "); most flushed to zero in " + fmt + " " +
                  num(100.0 * w.underflow, "%.3g") + "%" +
                  (w.underflow > 0.0 ? " (" + w.underflow_tensor + ", step " + std::to_string(w.underflow_step) + ")"
                                     : ""));
  // The advice: the scale may rise by the whole bits of the least headroom (an overflow
  // needs amax * 2^k past the format's max); else, if anything flushes, say how much.
  const std::string steps = "steps " + std::to_string(first_step_) + "-" + std::to_string(last_step_);
  const double k = std::floor(all_.headroom);
  if (std::isfinite(all_.headroom) && k >= 1.0)
    out.push_back("census advice: the loss scale could be 2^" + num(k, "%.0f") + " higher: the least headroom over " +
                  steps + " was " + num(all_.headroom, "%.1f") + " bits (" + all_.headroom_tensor + ")" +
                  (all_.underflow > 0.0 ? "; at most " + num(100.0 * all_.underflow, "%.3g") + "% of " +
                                              all_.underflow_tensor + "'s gradient flushes to zero in " + fmt +
                                              " at scale " + scale_text(all_.underflow_scale)
                                        : ""));
  else if (all_.underflow > 0.0)
    out.push_back("census advice: " + num(100.0 * all_.underflow, "%.3g") + "% of " + all_.underflow_tensor +
                  "'s gradient flushes to zero in " + fmt + " at scale " + scale_text(all_.underflow_scale) +
                  ", and the least headroom over " + steps + " was " + num(all_.headroom, "%.1f") +
                  " bits: the scale cannot rise; keep this tensor's gradient in FP32 or BF16");
  else
    out.push_back("census advice: nothing flushed to zero in " + fmt + " over " + steps +
                  " and the least headroom was " + num(all_.headroom, "%.1f") + " bits (" + all_.headroom_tensor +
                  "): the scale is right as it is");
  return out;
}

}  // namespace belay
