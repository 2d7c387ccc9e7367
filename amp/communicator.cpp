#include "amp/communicator.h"

#include "engine/error.h"
#ifdef BELAY_HAVE_MPI
#include "amp/mpi_communicator.h"
#endif

namespace belay {

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
  if (name == "nccl") throw UsageError("--dist nccl is not implemented yet: use --dist mpi (CPU)");
  throw UsageError("unknown --dist '" + name + "': use local or mpi");
}

}  // namespace belay
