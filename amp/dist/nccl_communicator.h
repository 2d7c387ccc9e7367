// Data parallelism between GPUs over NCCL (in the CUDA toolkit), one process per GPU,
// started by mpirun: MPI gives the rank and world size and carries NCCL's unique id from
// rank 0 to the others. A rank uses the GPU of its index on its node (MPI_Comm_split_type,
// MPI_COMM_TYPE_SHARED: with --map-by node the global rank would put two ranks on one GPU),
// made the current device before anything is allocated (the CUDA backend runs on the current
// device, "cuda:0"); more ranks on a node than GPUs is refused before NCCL starts.
// NCCL's init is non-blocking, polled with --dist-timeout (an init whose peer never joins
// hangs forever otherwise), and every wait on the GPU reads NCCL's asynchronous error: the
// communicator is aborted and the run ends naming NCCL's error.
// Built with the CUDA backend, MPI and NCCL (BELAY_HAVE_NCCL); in the emulated build against
// the emulated NCCL (kernels/cuda/emulation/nccl.cpp).
//
// Gradients travel in the same buckets as over MPI (amp/dist/bucketed_communicator.h), reduced
// in place in their own dtype by ncclAllReduce on a second stream: a bucket's reduction is
// ordered after the backward kernels that produced it (an event on the compute stream) and
// runs while backward's later kernels are still queued; finish orders the compute stream
// after the last bucket, and the host never waits for the gradients.
// The belts' agreement is a host round trip of three floats per step (copied out once the
// guard has run, agreed over MPI with the deadline, copied back): the price of the
// --dist-timeout on a GPU, paid on a few bytes.
//
// Sharded optimizer state (`--shard-optimizer`, ZeRO stage 1): the shard plan's owners, whole
// tensors as over MPI (amp/dist/shard_plan.h). NCCL's ncclReduceScatter splits a flat buffer
// into equal blocks, one per rank, so each bucket is packed on the NCCL stream into a flat
// buffer of N blocks of B elements (B: the most any rank owns in the bucket): block r holds
// rank r's own gradients of the bucket, in bucket order, zero-padded to B; the reduce-scatter
// (in place) leaves block `rank` summed on this rank, copied back into the gradients it owns.
// The others keep their unreduced local values, which the optimizer does not read. After
// the step, all_gather_params packs this rank's updated working copies into its block
// (chunks of --bucket-mb, one dtype each) and ncclAllGather (in place) hands every block to
// every rank. Why packing rather than ncclReduce/ncclBroadcast to and from each owner: one
// collective per bucket instead of one per tensor, the ring's bandwidth (each rank sends
// (N-1)/N of the buffer), and the two collectives ZeRO is built on; the price is a device copy
// of each bucket in and of the owned share out, and padding when the owners' shares in a
// bucket are uneven (whole tensors: a bucket of one tensor pads the other N-1 blocks).
// Each gradient element is summed in the reduce-scatter's ring order for its block (from rank
// b+1 round to rank b, in the buffer's dtype; nccl_ring_tests checks it): on 2 ranks one
// rounding of a + b, the unsharded all-reduce's bits; on 3 or more the order differs from the
// all-reduce's (which depends on the element's place in the bucket), within the same bound.
// The guard's per-tensor sums (Backend::guard_partials) are read to the host once a step
// and agreed over MPI as over MPI (Communicator::agree_on_partials); a checkpoint's state moves
// to rank 0 over MPI through host memory.
#pragma once
#include <memory>

#include "amp/dist/mpi_communicator.h"
#include "engine/error.h"

namespace belay {

class NcclCommunicator final : public MpiCommunicator {
 public:
  NcclCommunicator();
  ~NcclCommunicator() override;
  // Chooses the device and starts NCCL. Throws UsageError (on every rank alike) when a rank
  // sees no GPU or would share one; Error when NCCL's init fails or outlasts the timeout.
  void connect() override;

  std::string name() const override { return "nccl"; }
  void agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) override;
  void average_loss(Tensor& loss) override;
  void abort(int exit_code) override;
  void agree_on_partials(const std::vector<double>& partials, const std::vector<bool>& owned, Tensor& found_inf,
                         Tensor& nonfinite_loss, Tensor& norm) override;
  void all_gather_params(const std::vector<Var>& params) override;
  void gather_to_root(Tensor& t, int owner) override;
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
  // Polls a cudaEvent_t until it has completed, reading NCCL's asynchronous error, with the deadline.
  void wait_for_event(void* event, const char* what);
  void choose_device();
  // Throws (after aborting the communicator) when NCCL reports an asynchronous error;
  // returns whether the communicator is still busy (ncclInProgress).
  bool check_async_error(const char* what);
  // Polls until the communicator is no longer in progress, with the deadline.
  void wait_ready(const char* what);
  // ncclGroupEnd, waited for with the deadline when the communicator is still enqueueing.
  void group_end(const char* what);
  // The sharded bucket: packed, reduce-scattered, the owned share copied back (NCCL stream).
  void reduce_scatter_bucket(Bucket& bucket);
  // A device buffer of at least `bytes` for the packed collectives; a smaller one is kept
  // (work queued on the NCCL stream may still read it) and freed with the communicator.
  char* flat(size_t bytes);

  struct State;  // NCCL and CUDA handles (their headers stay out of this one)
  std::unique_ptr<State> s_;
};

}  // namespace belay
