// Tests that force CPU ISA paths one after another (force_cpu_isa) put the path they found
// back when they end, so the next test runs on the default path.
#pragma once
#include "kernels/cpu/cpu_isa.h"

namespace belay::test {

struct IsaRestore {
  CpuIsa saved = active_cpu_isa();
  ~IsaRestore() { force_cpu_isa(saved); }
};

}  // namespace belay::test
