// `belay plot --census census.csv -o census.svg`: a run's census (belay train --census) as two
// heat maps of tensors (rows, in the census's backward order) by recorded steps (columns):
// the headroom in bits, and the fraction of each gradient that flushes to zero. A cell whose
// tensor held an inf or NaN is black; a skipped step's column is marked above both maps.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace belay {

struct CensusTable {
  std::vector<std::string> tensors;  // in the file's order
  std::vector<int64_t> steps;        // ascending
  std::vector<bool> skipped;         // per step
  // [tensor][step]; NaN where the file has no row for that pair.
  std::vector<std::vector<double>> headroom, underflow_fraction;
  std::vector<std::vector<bool>> nonfinite;
};

// Reads a census CSV (amp/census_log.h's header); UsageError naming file and line otherwise.
CensusTable read_census(const std::string& path);
std::string census_svg(const CensusTable& table, const std::string& title);
int run_census_plot(const std::string& census, std::string out, std::ostream& os);

}  // namespace belay
