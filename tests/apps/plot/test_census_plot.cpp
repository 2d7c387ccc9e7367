// belay plot --census: the census file read back into tensors x steps, the SVG naming every
// tensor, a black cell where a tensor held an inf, a red tick over a skipped step; a file
// that is not a census is refused with a line naming it.
#include <catch2/catch.hpp>

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
