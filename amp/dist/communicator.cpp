#include "amp/dist/communicator.h"

#include <cmath>

#include "engine/error.h"
#ifdef BELAY_HAVE_MPI
#include "amp/dist/mpi_communicator.h"
#endif
#ifdef BELAY_HAVE_NCCL
#include "amp/dist/nccl_communicator.h"
#endif

namespace belay {

void Communicator::set_progress_thread(bool on) {
  if (on) throw UsageError("--dist-progress-thread is for --dist mpi (this is --dist " + name() + ")");
}

void Communicator::set_shards(const ShardPlan& plan) {
  if (plan.world_size != world_size())
    throw Error("set_shards: a plan for " + std::to_string(plan.world_size) + " ranks, the world has " +
                std::to_string(world_size()));
  shards_ = plan;
}

void Communicator::agree_on_partials(const std::vector<double>& partials, const std::vector<bool>& owned,
                                     Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) {
  float out[3];
  agree_on_partials_host(partials, owned, *nonfinite_loss.data_as<float>(), out);
  *found_inf.data_as<float>() = out[0];
  *nonfinite_loss.data_as<float>() = out[1];
  *norm.data_as<float>() = out[2];
}

void Communicator::agree_on_partials_host(const std::vector<double>& partials, const std::vector<bool>& owned,
                                          float loss_flag, float out[3]) {
  if (partials.size() != owned.size()) throw Error("agree_on_partials: one owned flag per partial sum is needed");
  std::vector<double> sums(partials.size());
  bool nonfinite = false;
  for (size_t t = 0; t < partials.size(); ++t) {
    const bool finite = std::isfinite(partials[t]);
    nonfinite = nonfinite || !finite;
    sums[t] = owned[t] || !finite ? partials[t] : 0.0;  // x + 0 is x: the sum over ranks is exact
  }
  // The unsharded guard's flag: non-finite gradient (0 or 1) plus the non-finite losses.
  float flags[2] = {(nonfinite ? 1.0f : 0.0f) + loss_flag, loss_flag};
  max_flags_over_ranks(flags, 2);
  sum_over_ranks(sums.data(), static_cast<int>(sums.size()));
  double total = 0.0;
  for (double s : sums) total += s;  // tensor order: the guard's (kernels/cpu/guard_kernels.cpp)
  out[0] = flags[0];
  out[1] = flags[1];
  out[2] = static_cast<float>(std::sqrt(total));
  agreements_ += world_size() > 1 ? 2 : 0;
}

std::unique_ptr<Communicator> make_communicator(const std::string& name) {
  if (name == "local") return std::make_unique<LocalCommunicator>();
  if (name == "mpi") {
#ifdef BELAY_HAVE_MPI
    return std::make_unique<MpiCommunicator>();
#else
    throw UsageError(
        "--dist mpi: this belay was built without MPI; install openmpi-bin and libopenmpi-dev "
        "(third_party/install_deps.sh) and rebuild");
#endif
  }
  if (name == "nccl") {
#ifdef BELAY_HAVE_NCCL
    return std::make_unique<NcclCommunicator>();
#else
    // NCCL needs the CUDA backend (GPU tensors) and MPI (to start: the unique id goes over it).
    throw UsageError(std::string("--dist nccl: this belay was built without NCCL (it needs ") +
#ifndef BELAY_HAVE_MPI
                     "MPI: openmpi-bin and libopenmpi-dev, " +
#endif
                     "the CUDA backend, and nccl.h and libnccl from the CUDA toolkit); use --dist mpi on the CPU, "
                     "or rebuild with CUDA on a machine that has them");
#endif
  }
  throw UsageError("unknown --dist '" + name + "': use local, mpi or nccl");
}

}  // namespace belay
