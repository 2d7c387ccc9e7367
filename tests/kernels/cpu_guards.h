// Guards for the kernel tests that change the CPU backend's global state: the ISA path they
// force (force_cpu_isa) and the OpenMP thread count they set. Each puts back what it found
// when it ends, so the next test runs as the default does.
#pragma once
#include <omp.h>

#include "kernels/cpu/cpu_isa.h"

namespace belay::test {

struct IsaRestore {
  CpuIsa saved = active_cpu_isa();
  ~IsaRestore() { force_cpu_isa(saved); }
};

// OpenMP runs n threads until the guard ends.
struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved); }
};

}  // namespace belay::test
