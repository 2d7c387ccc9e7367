// `belay plot --census census.csv -o census.svg`: a run's census (belay train --census) as two
// heat maps of tensors (rows, in the census's backward order) by recorded steps (columns):
// the headroom in bits, and the fraction of each gradient that flushes to zero. A cell whose
// tensor held an inf or NaN is black; a skipped step's column is marked above both maps. A
// long run's recorded steps are drawn at most kCensusColumns to a map, each column the worst
// of the steps it holds (census_columns), so the picture stays readable and its file small.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace belay {

struct CensusTable {
  std::vector<std::string> tensors;  // in the file's order
  std::vector<int64_t> steps;        // ascending (a column's first step, after census_columns)
  std::vector<bool> skipped;         // per step
  // [tensor][step]; NaN where the file has no row for that pair.
  std::vector<std::vector<double>> headroom, underflow_fraction;
  std::vector<std::vector<bool>> nonfinite;
  int64_t steps_per_column = 1;  // recorded steps a column holds (the last column may hold fewer)
};

// Reads a census CSV (amp/census_log.h's header); UsageError naming file and line otherwise.
CensusTable read_census(const std::string& path);

// The most columns a map draws: 900 pixels at 3 a column. 10,000 recorded steps of GPT-2
// small's 148 tensors, one column a step, would be 3 million rectangles (over 300 MB of SVG at
// the 107 bytes a rectangle of a real run's file: 700 steps of the default GPT took 5.4 MB).
constexpr int64_t kCensusColumns = 300;
// Which column recorded step j (0-based, in file order) falls in, `per` steps a column, and how
// many steps a column holds for `steps` steps in at most `columns` columns.
inline int64_t census_column_of(int64_t j, int64_t per) { return j / per; }
inline int64_t census_steps_per_column(int64_t steps, int64_t columns) {
  return steps <= columns ? 1 : (steps + columns - 1) / columns;
}
// t with its steps gathered `per` to a column (census_steps_per_column of at most `columns`),
// each column the worst of its steps: the least headroom, the largest fraction flushed, a
// non-finite cell or a skipped step if any of them had one (NaN where none had a row).
CensusTable census_columns(const CensusTable& t, int64_t columns);
std::string census_svg(const CensusTable& table, const std::string& title);
int run_census_plot(const std::string& census, std::string out, std::ostream& os);

}  // namespace belay
