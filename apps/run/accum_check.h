// `belay accum-check` and `belay sweep`: gradient accumulation proved and measured.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "apps/run/train.h"

namespace belay {

struct AccumCheckConfig {
  std::string model = "linear";
  int64_t in_features = 32, out_features = 4, hidden = 32;
  int64_t batch = 16;
  uint64_t seed = 0;
  double bound = 1e-4;
};

// FP32: accumulated gradients and post-step parameters against one full-batch backward,
// two splits against each other, and the wrong scaling (no 1/accum_steps) beside them.
// Returns 0 when every difference is below the bound, 1 otherwise.
int run_accum_check(const AccumCheckConfig& config, std::ostream& out);

struct SweepConfig {
  // model, dtype, device, ... (batch and micro_batch are set per point). With base.comm
  // (`belay sweep --ranks N` runs `--dist mpi` under mpirun) every point trains on all
  // ranks: the effective batch is micro-batch x accum x world size, and rank 0 reports.
  TrainConfig base;
  int64_t micro_batch = 8;
  std::vector<int64_t> accum{1, 2, 4, 8, 16};
  std::string json;  // written atomically; empty: table only
};

int run_sweep(const SweepConfig& config, std::ostream& out);

}  // namespace belay
