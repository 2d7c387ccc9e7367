// Compares two belay checkpoints for the distributed tests (tests/dist/dist_test.sh): every
// tensor of the first (masters and optimizer moments) against the second, element by
// element, within an absolute bound the caller states before the run; and the state that
// must be equal exactly (the scaler's, the step counts, the data position).
//   usage: compare_checkpoints A.safetensors B.safetensors BOUND
// Prints the largest difference of each tensor; exit 0 when all are within BOUND and the
// exact state matches, 1 when not, 2 on a bad file or usage.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "engine/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_checkpoints A B BOUND\n");
    return 2;
  }
  try {
    const belay::SafetensorsFile a = belay::read_safetensors(argv[1]);
    const belay::SafetensorsFile b = belay::read_safetensors(argv[2]);
    const double bound = std::stod(argv[3]);
    bool ok = true;
    for (const char* key : {"next_step", "optimizer_steps", "scaler.scale", "scaler.growth_tracker",
                            "scaler.hysteresis_left", "data_position"}) {
      const bool same = a.meta(key) == b.meta(key);
      std::printf("%-24s %s %s %s\n", key, a.meta(key).c_str(), same ? "==" : "!=", b.meta(key).c_str());
      ok = ok && same;
    }
    for (const std::string& name : a.names()) {
      const std::vector<float> x = a.tensor(name).to_vector(), y = b.tensor(name).to_vector();
      if (x.size() != y.size()) {
        std::printf("%-24s sizes differ: %zu vs %zu\n", name.c_str(), x.size(), y.size());
        ok = false;
        continue;
      }
      double worst = 0.0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double d = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
        if (!(d <= worst)) worst = d;  // a NaN difference becomes the worst
      }
      const bool within = worst <= bound;
      std::printf("%-24s max |diff| %.3g %s %.3g\n", name.c_str(), worst, within ? "<=" : "> ", bound);
      ok = ok && within;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", e.what());
    return 2;
  }
}
