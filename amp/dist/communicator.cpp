#include "amp/dist/communicator.h"

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
