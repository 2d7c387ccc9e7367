// `belay plot run.csv [other.csv ...] -o run.svg|run.png`: a picture of a run's step log.
// Four panels over the step: the loss, the gradient's L2 norm before and after clipping,
// the loss scale (log2 axis), the LR; every skipped step is a vertical mark through all
// panels, coloured by its reason. Several logs are overlaid (FP32 vs AMP), one colour each.
// A log with the `heldout_loss` column (belay train --eval-every N) also has its held-out
// loss in the loss panel: a point per evaluation, joined by a dashed line, in the log's colour.
//
// Why our own SVG writer (apps/plot/svg.h, ~100 lines) and not PLplot: Debian's libplplot-dev
// pulls in Qt 5, wxWidgets, GTK 3 and gfortran (57 packages on a bare Debian 12) for four
// line charts, and PLplot reports errors by calling exit() from C. SVG is text we can
// test with any XML parser; PNG is the same SVG rendered by rsvg-convert (librsvg, Debian
// package librsvg2-bin), found on the PATH when a .png is asked for.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "amp/step_log.h"

namespace belay {

struct RunLog {
  std::string name;  // as shown in the legend (the path given)
  std::vector<StepRow> rows;
  std::vector<std::string> policy;  // the optional `policy` column, one per row (empty when absent)
  // The optional `heldout_loss` column, one per row: NaN on a row without an evaluation
  // (the column's empty cell); empty when the log has no such column.
  std::vector<double> heldout;
};

// Reads a belay step log: the canonical 8-column header, optionally followed by `policy`,
// then optionally `heldout_loss` (the order belay train writes them in).
// Throws UsageError naming the file and line for anything else.
RunLog read_step_log(const std::string& path);
// The SVG document for these logs (at least one).
std::string plot_svg(const std::vector<RunLog>& logs);
// Writes `out` (.svg, or .png through rsvg-convert) atomically. Throws UsageError for an
// unknown extension, Error when rsvg-convert is missing or fails (nothing is written).
void write_plot(const std::vector<RunLog>& logs, const std::string& out);
// The CLI: default output is the first log's path with .csv replaced by .svg.
int run_plot(const std::vector<std::string>& csvs, std::string out, std::ostream& os);

// A polyline (points in drawing order, x in pixels, never decreasing) as at most 4 points a
// pixel column (floor of x): the first, the lowest, the highest and the last there, in their
// order. The same picture, every spike's extreme kept: a long run's lines are as long as the
// plot is wide, not as its rows are many (200,000 steps: 19.7 MB of SVG, 0.3 MB thinned).
std::vector<std::pair<double, double>> thin_to_pixels(const std::vector<std::pair<double, double>>& line);

}  // namespace belay
