// Internal for now (only the single-process communicator exists).
// The seam where data parallelism plugs in: gradients are all-reduced once per effective
// step, after the last micro-batch (never per micro-batch), and the safety belts' decisions
// (found_inf, the non-finite-loss flag, the norm) are agreed across ranks before anything
// acts on them, so every rank skips, clips and scales identically. The single-process
// communicator does nothing but count the calls; MpiCommunicator (amp/mpi_communicator.h,
// built when CMake finds MPI) sums CPU gradient buffers with MPI_Allreduce.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace belay {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_size() const = 0;
  virtual int rank() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi"
  // Sums every gradient buffer across ranks, in place. SafeStep has already divided each
  // rank's backward by the world size, so the sum is the average over the whole batch.
  virtual void all_reduce_gradients(const std::vector<Tensor*>& grads) = 0;
  // The belts' decision, made collectively right after the guard (one-element FP32 tensors,
  // updated in place): found_inf and nonfinite_loss become their maximum over ranks, and the
  // norm becomes sqrt(sum over ranks of norm^2 / world_size). Every rank holds the whole
  // averaged gradient (a replica, not a shard), so when the replicas agree that is exactly
  // each rank's own norm, bit for bit; when one rank's gradients differ (an inf planted on
  // it alone), every rank still gets the same value. Single process: nothing to agree.
  virtual void agree_on_guard(Tensor& /*found_inf*/, Tensor& /*nonfinite_loss*/, Tensor& /*norm*/) {}
  // The step's loss (one-element FP32, the mean over this rank's micro-batches) becomes the
  // mean over ranks: the log shows the loss of the whole effective batch.
  virtual void average_loss(Tensor& /*loss*/) {}
  // The largest of every rank's value (a stop signal seen by any rank stops them all at the
  // same step, so no rank leaves while its peers wait in a collective).
  virtual int max_over_ranks(int value) { return value; }
  // True when every rank passed the same checksum (of its weights and scaler state).
  virtual bool replicas_agree(uint64_t /*checksum*/) { return true; }
  // Ends every rank's process after an error on one of them (MPI_Abort): a rank that
  // simply returned would leave its peers waiting in a collective.
  virtual void abort(int exit_code) { (void)exit_code; }

  int64_t gradient_syncs() const { return gradient_syncs_; }
  int64_t gradient_bytes() const { return gradient_bytes_; }  // sent into all-reduces, this rank
  int64_t agreements() const { return agreements_; }          // small collectives of the belts

 protected:
  int64_t gradient_syncs_ = 0;
  int64_t gradient_bytes_ = 0;
  int64_t agreements_ = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int world_size() const override { return 1; }
  int rank() const override { return 0; }
  std::string name() const override { return "local"; }
  void all_reduce_gradients(const std::vector<Tensor*>&) override { ++gradient_syncs_; }
};

// `--dist NAME`: "local" (one process) or "mpi" (started by mpirun; rank and world size
// from the launcher). Throws UsageError for an unknown name or one this build lacks.
std::unique_ptr<Communicator> make_communicator(const std::string& name);

}  // namespace belay
