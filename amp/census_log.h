// The census file (`belay train --census FILE`): one CSV row per gradient per recorded step,
// and the summary of a run's census: per tensor class the least headroom and the most
// underflow seen, with one line of advice read off those counts.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "amp/step_log.h"
#include "engine/census.h"
#include "engine/dtype.h"

namespace belay {

extern const char* const kCensusHeader;
// The census file's name for a cast site (StepRow::cast_census): "cast:" and the site, so a
// weight's forward cast and its gradient are told apart ("cast:blocks.0.mlp.fc.weight").
std::string cast_row_name(const std::string& site);

// One tensor's row, no newline: the columns of kCensusHeader.
std::string format_census_row(int64_t step, const TensorCensus& c, DType format, bool skipped, float scale);

class CensusLogWriter {
 public:
  // Opens (truncates) `path`, writes the header; throws UsageError naming the path if it
  // cannot. Rows of steps that are multiples of `every` are written, and every skipped step.
  CensusLogWriter(const std::string& path, int64_t every, DType format);
  ~CensusLogWriter();
  CensusLogWriter(const CensusLogWriter&) = delete;
  CensusLogWriter& operator=(const CensusLogWriter&) = delete;
  bool records(const StepRow& row) const { return row.skipped || row.step % every_ == 0; }
  // The row's census (all its gradients, then its cast sites, flushed) when records(row);
  // `scale` is the one the step ran with. Returns whether it wrote.
  bool write(const StepRow& row, float scale);
  void close();

 private:
  std::string path_;
  int64_t every_;
  DType format_;
  std::FILE* file_ = nullptr;
};

// A tensor's class: its name with every block index replaced by '*' ("blocks.*.mlp.fc.weight"),
// so the blocks of a deep model summarise as one line each.
std::string tensor_class(const std::string& name);

// What a run's census saw, over its applied steps (a skipped step's gradient is discarded,
// so its headroom says nothing about the scale that was used), and what the forward's casts
// lost over every step.
class CensusSummary {
 public:
  explicit CensusSummary(DType format) : format_(format) {}
  void observe(const StepRow& row, float scale);
  // One line per tensor class, then the advice; then, when the casts were counted, one line
  // per cast class and their advice. Empty when no step was seen.
  std::vector<std::string> lines() const;

 private:
  // The forward's casts: the least headroom, the most flushed and the values made
  // non-finite, with the site and step of each.
  struct CastWorst {
    double headroom = 1e300;
    std::string headroom_site;
    double underflow = 0.0;
    std::string underflow_site;
    uint64_t nonfinite = 0;
    std::string nonfinite_site;
    int64_t nonfinite_step = -1;
  };
  std::vector<std::string> grad_lines() const;
  void observe_casts(const StepRow& row);
  std::vector<std::string> cast_lines() const;
  std::map<std::string, CastWorst> cast_classes_;
  CastWorst cast_all_;

  struct Worst {
    double headroom = 1e300;  // least headroom (bits) and where
    std::string headroom_tensor;
    int64_t headroom_step = -1;
    double underflow = 0.0;   // largest fraction of the elements that flush to zero, and where
    std::string underflow_tensor;
    int64_t underflow_step = -1;
    float underflow_scale = 1.0f;
  };
  DType format_;
  std::map<std::string, Worst> classes_;
  Worst all_;
  int64_t first_step_ = -1, last_step_ = -1;
};

}  // namespace belay
