// belay plot --census: the census file read back into tensors x steps, the SVG naming every
// tensor, a black cell where a tensor held an inf, a red tick over a skipped step; a file
// that is not a census is refused with a line naming it.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "amp/census_log.h"
#include "apps/plot/census_plot.h"
#include "engine/error.h"
#include "tests/files.h"

using namespace belay;

TEST_CASE("census plot: tensors x steps, skipped steps and non-finite cells marked", "[apps][plot][census]") {
  const std::string path = test::temp_path("census_plot", "census.csv");
  {
    std::ofstream f(path);
    f << kCensusHeader << "\n";
    for (int step : {0, 2, 4})
      for (const char* name : {"blocks.0.mlp.fc.weight", "wte.weight"}) {
        TensorCensus c;
        c.name = name;
        c.numel = 100;
        c.amax = step == 2 && std::string(name) == "wte.weight" ? 3.0f : 1.0f / 64.0f;
        c.nonfinite = step == 2 && std::string(name) == "wte.weight" ? 1 : 0;
        c.underflow = static_cast<uint64_t>(step);
        f << format_census_row(step, c, DType::F16, step == 2, 1024.0f) << "\n";
      }
  }
  const CensusTable t = read_census(path);
  REQUIRE(t.tensors.size() == 2);
  REQUIRE(t.steps == std::vector<int64_t>{0, 2, 4});
  CHECK(t.skipped == std::vector<bool>{false, true, false});
  CHECK(t.nonfinite[1][1]);
  CHECK(!t.nonfinite[0][1]);
  CHECK(t.underflow_fraction[0][2] == Approx(0.04));
  CHECK(t.headroom[0][0] == Approx(std::log2(65504.0 * 64.0)));
  const std::string svg = census_svg(t, "run");
  CHECK(svg.find(">blocks.0.mlp.fc.weight</text>") != std::string::npos);
  CHECK(svg.find(">wte.weight</text>") != std::string::npos);
  CHECK(svg.find("fill=\"#000\"") != std::string::npos);    // the inf's cell
  CHECK(svg.find("stroke=\"#d00\"") != std::string::npos);  // the skipped step's tick
  std::ostringstream os;
  const std::string out = test::temp_path("census_plot", "census.svg");
  CHECK(run_census_plot(path, out, os) == 0);
  CHECK(os.str() == "wrote " + out + " (2 tensors x 3 steps)\n");
  const std::string bad = test::temp_path("census_plot", "bad.csv");
  std::ofstream(bad) << "step,lr\n";
  CHECK_THROWS_AS(read_census(bad), UsageError);
  CHECK_THROWS_WITH(run_census_plot(path, test::temp_path("census_plot", "x.png"), os), Catch::Contains(".svg"));
}

// A table of `tensors` x `steps` recorded steps (step numbers 0, 2, 4, ...), every cell 20 bits
// of headroom and nothing flushed, for the tests below to plant values in.
static CensusTable plain_table(size_t tensors, size_t steps) {
  CensusTable t;
  for (size_t i = 0; i < tensors; ++i) t.tensors.push_back("t" + std::to_string(i));
  for (size_t j = 0; j < steps; ++j) t.steps.push_back(static_cast<int64_t>(2 * j));
  t.skipped.assign(steps, false);
  t.headroom.assign(tensors, std::vector<double>(steps, 20.0));
  t.underflow_fraction.assign(tensors, std::vector<double>(steps, 0.0));
  t.nonfinite.assign(tensors, std::vector<bool>(steps, false));
  return t;
}

TEST_CASE("census plot: a long run's steps drawn as at most 300 columns, each the worst of its steps",
          "[apps][plot][census]") {
  CHECK(census_steps_per_column(300, 300) == 1);
  CHECK(census_steps_per_column(301, 300) == 2);
  CHECK(census_steps_per_column(1000, 300) == 4);
  CHECK(census_steps_per_column(90000, 300) == 300);
  CHECK(census_column_of(515, 4) == 128);
  CHECK(census_column_of(516, 4) == 129);

  CensusTable t = plain_table(2, 1000);
  t.headroom[1][517] = 1.5;            // one step near overflow: its column shows it
  t.underflow_fraction[1][998] = 0.3;  // in the last column
  t.nonfinite[1][3] = true;
  t.skipped[700] = true;
  for (size_t j = 0; j < 4; ++j) t.headroom[0][j] = t.underflow_fraction[0][j] = std::nan("");  // no rows there
  t.headroom[0][5] = std::nan("");  // one missing row among others: the others' worst
  const CensusTable c = census_columns(t, kCensusColumns);
  REQUIRE(c.steps.size() == 250);
  CHECK(c.steps_per_column == 4);
  CHECK(c.steps[0] == 0);
  CHECK(c.steps[129] == 2 * 516);  // a column is labelled with its first step
  CHECK(c.headroom[1][129] == 1.5);
  CHECK(c.headroom[1][128] == 20.0);
  CHECK(c.underflow_fraction[1][249] == 0.3);
  CHECK(c.underflow_fraction[1][248] == 0.0);
  CHECK(c.nonfinite[1][0]);
  CHECK(!c.nonfinite[0][0]);
  CHECK(c.skipped[175]);
  CHECK(!c.skipped[174]);
  CHECK(std::isnan(c.headroom[0][0]));
  CHECK(std::isnan(c.underflow_fraction[0][0]));
  CHECK(c.headroom[0][1] == 20.0);

  // The picture: 2 maps x 2 tensors x 250 cells, not x 1000, and its caption says so.
  const std::string svg = census_svg(t, "long run");
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  CHECK(rects >= 2 * 2 * 250);
  CHECK(rects < 2 * 2 * 250 + 100);  // the frames, the colour keys' bands and the background
  CHECK(svg.find("a column: the worst of 4 of them") != std::string::npos);
  // A short run keeps a column a step, and no such caption.
  CHECK(census_columns(plain_table(1, 300), kCensusColumns).steps.size() == 300);
  CHECK(census_svg(plain_table(1, 300), "short").find("the worst of") == std::string::npos);
}

TEST_CASE("census plot: a step that is not a step number is refused, CRLF line ends are read", "[apps][plot][census]") {
  TensorCensus c;
  c.name = "wte.weight";
  c.numel = 10;
  c.amax = 1.0f;
  const std::string row = format_census_row(7, c, DType::F16, false, 1024.0f);
  REQUIRE(row.rfind("7,", 0) == 0);
  const std::string crlf = test::temp_path("census_plot", "crlf.csv");
  std::ofstream(crlf) << kCensusHeader << "\r\n" << row << "\r\n";
  const CensusTable t = read_census(crlf);
  CHECK(t.steps == std::vector<int64_t>{7});
  CHECK(t.tensors == std::vector<std::string>{"wte.weight"});
  for (const char* step : {"1.5", "nan", "inf", "-3", "1e3", "+4", "99999999999999999999", ""}) {
    const std::string path = test::temp_path("census_plot", "bad_step.csv");
    std::ofstream(path) << kCensusHeader << "\n" << step << row.substr(1) << "\n";
    CHECK_THROWS_WITH(read_census(path), Catch::Contains("is not a step number") && Catch::Contains(":2"));
  }
  const std::string dir = std::filesystem::path(crlf).parent_path().string();  // said: no header, before
  CHECK_THROWS_WITH(read_census(dir), Catch::Equals("census file '" + dir + "' is a directory"));
}
