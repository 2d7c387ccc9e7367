// Linked into the emulated GPU test binary only: each run of it appends how often every
// kernel ran (kernels/cuda/emulation/simt.cpp, at exit) to the build's log, which
// tests/emulation/kernel_coverage.sh reads. A BELAY_EMU_COVERAGE set by the caller wins.
#include <cstdlib>

namespace {
const bool belay_coverage_log_set = [] {
  setenv("BELAY_EMU_COVERAGE", BELAY_EMU_COVERAGE_LOG, 0);
  return true;
}();
}  // namespace
