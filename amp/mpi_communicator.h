// Data parallelism between CPU processes over MPI (OpenMPI from Debian), one process per
// rank, started by mpirun: rank and world size come from the launcher. Built only when
// CMake finds MPI (BELAY_HAVE_MPI). First slice: one blocking MPI_Allreduce over one flat
// FP32 buffer per effective step (no buckets, no overlap with backward yet).
#pragma once
#include <vector>

#include "amp/communicator.h"

namespace belay {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator();   // MPI_Init unless already initialised
  ~MpiCommunicator();  // MPI_Finalize if this object initialised MPI
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int world_size() const override { return world_size_; }
  int rank() const override { return rank_; }
  std::string name() const override { return "mpi"; }
  void all_reduce_gradients(const std::vector<Tensor*>& grads) override;
  void agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) override;
  void average_loss(Tensor& loss) override;
  int max_over_ranks(int value) override;
  bool replicas_agree(uint64_t checksum) override;
  void abort(int exit_code) override;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  bool owns_mpi_ = false;
  std::vector<float> flat_;  // every gradient, packed as FP32; kept so a steady step allocates nothing
};

}  // namespace belay
