// Data parallelism between GPUs over NCCL (in the CUDA toolkit), one process per GPU,
// started by mpirun: MPI gives the rank and world size and carries NCCL's unique id from
// rank 0 to the others; rank r uses GPU r % (GPUs on its node), made the current device
// before anything is allocated (the CUDA backend runs on the current device, "cuda:0").
// Built only with the CUDA backend, MPI and NCCL (BELAY_HAVE_NCCL).
//
// Gradients travel in the same buckets as over MPI (amp/dist/bucketed_communicator.h), reduced
// in place in their own dtype by ncclAllReduce on a second stream: a bucket's reduction is
// ordered after the backward kernels that produced it (an event on the compute stream) and
// runs while backward's later kernels are still queued; finish orders the compute stream
// after the last bucket, and the host never waits for the gradients.
// The belts' agreement is a host round trip of three floats per step (copied out once the
// guard has run, agreed over MPI with the deadline, copied back): the price of the
// --dist-timeout on a GPU, paid on a few bytes.
#pragma once
#include <memory>

#include "amp/dist/mpi_communicator.h"

namespace belay {

class NcclCommunicator final : public MpiCommunicator {
 public:
  // Throws UsageError (on every rank alike) when a rank sees no GPU.
  NcclCommunicator();
  ~NcclCommunicator() override;

  std::string name() const override { return "nccl"; }
  void agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) override;
  void average_loss(Tensor& loss) override;
  void abort(int exit_code) override;
  // NCCL moves data on its own stream: no progress thread (the base's refusal, not MPI's).
  void set_progress_thread(bool on) override { Communicator::set_progress_thread(on); }

 protected:
  void start_bucket(size_t index, Bucket& bucket) override;
  void complete_buckets(std::vector<Bucket>& buckets) override;
  void progress() override {}  // NCCL moves data on its own stream
  size_t wire_bytes(const Tensor& g) const override;

 private:
  // Copies n device floats to the pinned buffer and waits for them with the deadline.
  void read_scalars(const std::vector<Tensor*>& scalars, const char* what);
  void write_scalars(const std::vector<Tensor*>& scalars);

  struct State;  // NCCL and CUDA handles (their headers stay out of this one)
  std::unique_ptr<State> s_;
};

}  // namespace belay
