#include "apps/plot/census_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "amp/census_log.h"
#include "apps/plot/svg.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/text_fields.h"
#include "engine/text_file.h"

namespace belay {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double number_in(const std::string& s, const std::string& where) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') throw UsageError(where + ": '" + s + "' is not a number");
  return v;
}

// A step number as the log writes it (parse_count: digits only).
int64_t step_in(const std::string& s, const std::string& where) {
  const std::optional<int64_t> v = parse_count(s);
  if (!v) throw UsageError(where + ": step '" + s + "' is not a step number");
  return *v;
}

// A colour from white (t = 0) to `to` (t = 1), t clamped to [0, 1].
std::string ramp(double t, int r, int g, int b) {
  t = std::clamp(t, 0.0, 1.0);
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(255 - t * (255 - r)),
                static_cast<int>(255 - t * (255 - g)), static_cast<int>(255 - t * (255 - b)));
  return buf;
}

// Headroom colours: red at 0 bits (an overflow is one doubling away), through white at 6, to
// blue at 30 and beyond. 30 and not 16: at a low scale (--init-scale 1) every gradient has 16
// to 34 bits to spare, and a map that saturates at 16 would show one flat blue.
constexpr double kHeadroomWhite = 6.0, kHeadroomBlue = 30.0;
std::string headroom_colour(double bits) {
  if (bits < kHeadroomWhite) return ramp((kHeadroomWhite - bits) / kHeadroomWhite, 200, 30, 30);
  return ramp((bits - kHeadroomWhite) / (kHeadroomBlue - kHeadroomWhite), 30, 80, 200);
}

// Underflow: white at 0, dark orange at 10% of the tensor and above, on a square-root
// scale, so a few elements in a million still show.
std::string underflow_colour(double fraction) { return ramp(std::sqrt(std::clamp(fraction / 0.1, 0.0, 1.0)), 190, 80, 0); }

// A colour key beside a map: a vertical bar from `lo` (bottom) to `hi` (top) in `colour`'s
// colours, labelled at its ends and middle with `unit`.
void colour_key(Svg& svg, double x, double y0, double h, double lo, double hi, std::string (*colour)(double),
                const std::string& unit) {
  const int bands = 40;
  for (int b = 0; b < bands; ++b) {
    const double v = hi - (hi - lo) * (b + 0.5) / bands;
    svg.rect(x, y0 + h * b / bands, 12, h / bands + 0.3, SvgStyle{"none", 0, "", colour(v)});
  }
  svg.rect(x, y0, 12, h, SvgStyle{"#888", 0.5, ""});
  const double mid = (lo + hi) / 2;
  const std::pair<double, double> labels[] = {{hi, y0 + 9}, {mid, y0 + h / 2 + 3}, {lo, y0 + h}};
  for (const auto& [v, y] : labels) {
    char buf[32];
    std::snprintf(buf, sizeof buf, unit == "%" ? "%.1f%%" : "%.0f %s", unit == "%" ? v * 100 : v, unit.c_str());
    svg.text(x + 16, y, buf, 9);
  }
}

}  // namespace

namespace {

// What a census file says, before it is laid out as a table: each (tensor, step) row's cell,
// the tensors in the order they first appear, and each step's skipped flag.
struct CensusRows {
  struct Cell {
    double headroom, underflow;
    bool nonfinite;
  };
  std::map<std::pair<std::string, int64_t>, Cell> cells;
  std::vector<std::string> tensors;
  std::map<std::string, size_t> tensor_index;  // tensors' positions, for the lookup per row
  std::map<int64_t, bool> steps;  // step -> skipped
};

// One data row (11 fields) into r.
void add_census_row(const std::string& line, const std::string& where, CensusRows& r) {
  const std::vector<std::string> f = split_fields(line);
  if (f.size() != 11) throw UsageError(where + ": " + std::to_string(f.size()) + " fields, the header has 11");
  const int64_t step = step_in(f[0], where);
  const double numel = number_in(f[2], where);
  if (r.tensor_index.emplace(f[1], r.tensors.size()).second) r.tensors.push_back(f[1]);
  r.cells[{f[1], step}] = {number_in(f[8], where), numel > 0 ? number_in(f[5], where) / numel : 0.0,
                           number_in(f[3], where) > 0};
  r.steps[step] = r.steps[step] || f[9] == "1";
}

CensusRows read_census_rows(const std::string& path) {
  std::ifstream in = open_text_file(path, "census file");
  std::string line;
  if (!read_text_line(in, line) || line != kCensusHeader)
    throw UsageError("census file '" + path + "' does not start with the header " + std::string(kCensusHeader));
  CensusRows r;
  for (int64_t lineno = 2; read_text_line(in, line); ++lineno)
    if (!line.empty()) add_census_row(line, path + ":" + std::to_string(lineno), r);
  if (r.cells.empty()) throw UsageError("census file '" + path + "' has no rows");
  return r;
}

}  // namespace

CensusTable read_census(const std::string& path) {
  const CensusRows r = read_census_rows(path);
  CensusTable t;
  t.tensors = r.tensors;
  for (const auto& [s, skipped] : r.steps) {
    t.steps.push_back(s);
    t.skipped.push_back(skipped);
  }
  const size_t nt = t.tensors.size(), ns = t.steps.size();
  t.headroom.assign(nt, std::vector<double>(ns, kNaN));
  t.underflow_fraction.assign(nt, std::vector<double>(ns, kNaN));
  t.nonfinite.assign(nt, std::vector<bool>(ns, false));
  for (size_t j = 0; j < ns; ++j)
    for (size_t i = 0; i < nt; ++i) {
      const auto it = r.cells.find({t.tensors[i], t.steps[j]});
      if (it == r.cells.end()) continue;
      t.headroom[i][j] = it->second.headroom;
      t.underflow_fraction[i][j] = it->second.underflow;
      t.nonfinite[i][j] = it->second.nonfinite;
    }
  return t;
}

CensusTable census_columns(const CensusTable& t, int64_t columns) {
  const int64_t ns = static_cast<int64_t>(t.steps.size()), per = census_steps_per_column(ns, columns);
  if (per == 1) return t;
  const int64_t nc = census_column_of(ns - 1, per) + 1;
  const size_t nt = t.tensors.size();
  CensusTable c;
  c.tensors = t.tensors;
  c.steps_per_column = per * t.steps_per_column;
  c.skipped.assign(static_cast<size_t>(nc), false);
  c.headroom.assign(nt, std::vector<double>(static_cast<size_t>(nc), kNaN));
  c.underflow_fraction = c.headroom;
  c.nonfinite.assign(nt, std::vector<bool>(static_cast<size_t>(nc), false));
  for (int64_t j = 0; j < ns; ++j) {
    const size_t col = static_cast<size_t>(census_column_of(j, per)), from = static_cast<size_t>(j);
    if (col == c.steps.size()) c.steps.push_back(t.steps[from]);
    c.skipped[col] = c.skipped[col] || t.skipped[from];
    for (size_t i = 0; i < nt; ++i) {
      // fmin and fmax return the other operand where one is NaN: a step without a row adds nothing.
      c.headroom[i][col] = std::fmin(c.headroom[i][col], t.headroom[i][from]);
      c.underflow_fraction[i][col] = std::fmax(c.underflow_fraction[i][col], t.underflow_fraction[i][from]);
      c.nonfinite[i][col] = c.nonfinite[i][col] || t.nonfinite[i][from];
    }
  }
  return c;
}

std::string census_svg(const CensusTable& table, const std::string& title) {
  const CensusTable t = census_columns(table, kCensusColumns);
  const size_t nt = t.tensors.size(), ns = t.steps.size();
  size_t longest = 0;
  for (const std::string& n : t.tensors) longest = std::max(longest, n.size());
  const double label_w = 12.0 + 6.2 * static_cast<double>(longest), row_h = 14.0;
  const double map_w = std::clamp(6.0 * static_cast<double>(ns), 300.0, 900.0), cell_w = map_w / static_cast<double>(ns);
  const double map_h = row_h * static_cast<double>(nt), top = 50.0, gap = 60.0;
  const double width = label_w + map_w + 150.0, height = top + 2 * map_h + gap + 70.0;
  Svg svg(width, height);
  svg.rect(0, 0, width, height, SvgStyle{"none", 0, "", "#fff"});
  svg.text(width / 2, 22, title, 14, "middle");
  struct Panel { const char* name; bool headroom; };
  const Panel panels[] = {{"headroom (bits; red: near overflow, white 6, blue: 30 or more to spare)", true},
                          {"flushed to zero (fraction of the tensor; white 0, orange >= 10%)", false}};
  for (int p = 0; p < 2; ++p) {
    const double y0 = top + p * (map_h + gap);
    svg.text(label_w, y0 - 8, panels[p].name, 11);
    for (size_t i = 0; i < nt; ++i) {
      const double y = y0 + row_h * static_cast<double>(i);
      svg.text(label_w - 6, y + row_h - 3, t.tensors[i], 10, "end");
      for (size_t j = 0; j < ns; ++j) {
        const double v = panels[p].headroom ? t.headroom[i][j] : t.underflow_fraction[i][j];
        std::string colour = std::isnan(v) ? "#eee" : panels[p].headroom ? headroom_colour(v) : underflow_colour(v);
        if (t.nonfinite[i][j]) colour = "#000";
        svg.rect(label_w + cell_w * static_cast<double>(j), y, cell_w + 0.3, row_h, SvgStyle{"none", 0, "", colour});
      }
    }
    svg.rect(label_w, y0, map_w, map_h, SvgStyle{"#888", 0.5, ""});
    if (panels[p].headroom) colour_key(svg, label_w + map_w + 10, y0, map_h, 0.0, kHeadroomBlue, headroom_colour, "bits");
    else colour_key(svg, label_w + map_w + 10, y0, map_h, 0.0, 0.1, underflow_colour, "%");
    // Skipped steps: a red tick above the column.
    for (size_t j = 0; j < ns; ++j)
      if (t.skipped[j]) {
        const double x = label_w + cell_w * (static_cast<double>(j) + 0.5);
        svg.line(x, y0 - 5, x, y0 - 1, SvgStyle{"#d00", std::max(2.0, cell_w * 0.8), ""});
      }
    // Step labels: first, last and a few between.
    const size_t ticks = std::min<size_t>(ns, 6);
    for (size_t k = 0; k < ticks; ++k) {
      const size_t j = ticks == 1 ? 0 : k * (ns - 1) / (ticks - 1);
      svg.text(label_w + cell_w * (static_cast<double>(j) + 0.5), y0 + map_h + 12, std::to_string(t.steps[j]), 9,
               "middle");
    }
  }
  const double ly = height - 22;
  const std::string columns =
      t.steps_per_column == 1 ? "" : "; a column: the worst of " + std::to_string(t.steps_per_column) + " of them";
  svg.text(label_w, ly - 12, "step (recorded steps only" + columns + ") ->", 10);
  svg.text(label_w, ly, "red tick: a skipped step; black cell: the tensor held an inf or NaN", 10);
  return svg.str();
}

int run_census_plot(const std::string& census, std::string out, std::ostream& os) {
  if (out.empty()) out = (census.size() > 4 && census.substr(census.size() - 4) == ".csv" ? census.substr(0, census.size() - 4) : census) + ".svg";
  if (out.size() < 4 || out.substr(out.size() - 4) != ".svg")
    throw UsageError("census plot output '" + out + "' must end in .svg (render a PNG with rsvg-convert)");
  const CensusTable t = read_census(census);
  write_file_atomically(out, census_svg(t, "belay census: " + census));
  os << "wrote " << out << " (" << t.tensors.size() << " tensors x " << t.steps.size() << " steps)\n";
  return 0;
}

}  // namespace belay
