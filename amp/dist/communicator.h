// The seam where data parallelism plugs in: gradients are all-reduced once per effective
// step, during and after the last micro-batch's backward (never on the earlier ones: DDP's
// no_sync), and the safety belts' decisions (found_inf, the non-finite-loss flag, the norm)
// are agreed across ranks before anything acts on them, so every rank skips, clips and
// scales identically. The single-process communicator does nothing but count the calls;
// BucketedCommunicator (amp/dist/bucketed_communicator.h) sends the gradients in buckets while
// backward runs: MpiCommunicator (CPU tensors, amp/dist/mpi_communicator.h) and
// NcclCommunicator (GPU tensors, amp/dist/nccl_communicator.h), each built when CMake finds it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "amp/dist/shard_plan.h"
#include "autograd/graph.h"
#include "engine/tensor.h"

namespace belay {

// Everything a communicator counts, as one value: a run that shares the communicator with
// others (belay sweep) takes a snapshot before and subtracts it after.
struct CommCounters {
  int64_t gradient_syncs = 0, gradient_buckets = 0, buckets_during_backward = 0, buckets_done_in_backward = 0;
  int64_t gradient_bytes = 0, agreements = 0;
  double gradient_sync_seconds = 0.0, gradient_wait_seconds = 0.0;
  CommCounters operator-(const CommCounters& o) const {
    return {gradient_syncs - o.gradient_syncs,
            gradient_buckets - o.gradient_buckets,
            buckets_during_backward - o.buckets_during_backward,
            buckets_done_in_backward - o.buckets_done_in_backward,
            gradient_bytes - o.gradient_bytes,
            agreements - o.agreements,
            gradient_sync_seconds - o.gradient_sync_seconds,
            gradient_wait_seconds - o.gradient_wait_seconds};
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_size() const = 0;
  virtual int rank() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi", "nccl"
  // Sums every gradient buffer across ranks, in place, and returns when they hold the sum.
  // SafeStep has already divided each rank's backward by the world size, so the sum is the
  // average over the whole batch.
  virtual void all_reduce_gradients(const std::vector<Tensor*>& grads) = 0;

  // The same, spread over the last micro-batch's backward (SafeStep makes the three calls):
  // begin before it with the parameters, leaf_done from backward's hook as each gradient
  // becomes final, finish after it. What this base does: everything in finish, in one call.
  // hooks_backward() says whether leaf_done does anything (SafeStep hooks backward then).
  virtual bool hooks_backward() const { return false; }
  virtual void begin_gradient_sync(const std::vector<Var>& params) { sync_params_ = &params; }
  virtual void leaf_done(Node& /*leaf*/) {}
  virtual void finish_gradient_sync() {
    std::vector<Tensor*> grads;
    for (const Var& p : *sync_params_)
      if (p.grad().defined()) grads.push_back(&p.node()->grad);
    all_reduce_gradients(grads);
  }

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
  // A thread that moves the gradient buckets while backward computes, for a transport that
  // moves data only when called (`--dist-progress-thread`; MPI only).
  virtual void set_progress_thread(bool on);

  // ---- Sharded optimizer state (ZeRO stage 1, `--shard-optimizer`)
  // With a plan (amp/dist/shard_plan.h, one owner per parameter in the optimizer's order) the
  // gradient sync is a reduce-scatter: each parameter's gradient is summed on its owner
  // alone, in rank order 0..N-1; the owner updates it; all_gather_params then sends the
  // updated working copy (the FP32 weights when there is none) from the owner to every rank.
  // Over NCCL the same owners, reduced by ncclReduceScatter (amp/dist/nccl_communicator.h).
  virtual void set_shards(const ShardPlan& plan);
  bool sharded() const { return !shards_.owner.empty(); }
  const ShardPlan& shards() const { return shards_; }
  // The guard's agreement when sharded: partials[t] is this rank's sum of squares of gradient
  // t (Backend::guard_partials over the gradients the optimizer will read), owned[t] whether
  // this rank owns it. Each tensor's sum counts once, from its owner (a non-owner's copy is
  // not reduced), except that a non-finite sum counts from any rank (an inf planted in one
  // rank's copy after the sync, --inject-inf, must still skip the step everywhere). The sums
  // go to every rank in one all-reduce and are added in tensor order, as the guard adds them:
  // norm = sqrt(sum), the unsharded norm's bits. found_inf (written: non-finite gradient plus
  // the non-finite losses, as the guard's) and nonfinite_loss (this rank's on entry) become
  // their maximum over ranks in a second small all-reduce, as in agree_on_guard.
  // The scalars are read and written in host memory here; NCCL moves them to and from its GPU.
  virtual void agree_on_partials(const std::vector<double>& partials, const std::vector<bool>& owned,
                                 Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm);
  // After the optimizer step, every rank calls it: each parameter's value from its owner.
  virtual void all_gather_params(const std::vector<Var>& params) { (void)params; }
  // A checkpoint of sharded state: t (same shape on every rank) moves from rank `owner` to
  // rank 0, into t there; every other rank does nothing. Every rank calls it in the same order.
  virtual void gather_to_root(Tensor& t, int owner) { (void)t, (void)owner; }
  // One number from every rank, in rank order (the run summary's per-rank memory).
  virtual std::vector<double> all_gather_value(double value) { return {value}; }

  // Connects to the peers once the settings above are made (NCCL's init, bounded by the
  // timeout); a communicator that needs nothing more does nothing. Called once, before use.
  virtual void connect() {}

  // The gradient buckets' size (`--bucket-mb`), in bytes of FP32 gradient; 0: one bucket.
  void set_bucket_bytes(size_t bytes) { bucket_bytes_ = bytes; }
  size_t bucket_bytes() const { return bucket_bytes_; }
  // How long a rank waits for its peers in any collective before it stops them all with an
  // error (`--dist-timeout`): a rank that died or hangs must not hang the run forever.
  void set_timeout_seconds(double seconds) { timeout_seconds_ = seconds; }
  double timeout_seconds() const { return timeout_seconds_; }

  int64_t gradient_syncs() const { return gradient_syncs_; }    // effective steps synced
  int64_t gradient_buckets() const { return gradient_buckets_; }  // bucket all-reduces started
  // Buckets started while backward still ran (the rest start when it has ended).
  int64_t buckets_during_backward() const { return buckets_during_backward_; }
  // Buckets whose reduction had completed by the time backward ended (the overlap achieved;
  // counted where the transport can tell: MPI yes, NCCL no, it never waits on the host).
  int64_t buckets_done_in_backward() const { return buckets_done_in_backward_; }
  int64_t gradient_bytes() const { return gradient_bytes_; }  // sent into all-reduces, this rank
  int64_t agreements() const { return agreements_; }          // small collectives of the belts
  // Host wall time inside the gradient sync (packing, starting, waiting, unpacking), and the
  // part of it spent waiting for the reduction to complete. The belts' collectives are not in it.
  double gradient_sync_seconds() const { return gradient_sync_seconds_; }
  double gradient_wait_seconds() const { return gradient_wait_seconds_; }
  CommCounters counters() const {
    return {gradient_syncs_, gradient_buckets_, buckets_during_backward_, buckets_done_in_backward_,
            gradient_bytes_, agreements_, gradient_sync_seconds_, gradient_wait_seconds_};
  }

 protected:
  // agree_on_partials' transport: sums (FP64) and maxima (FP32) over ranks, in place.
  virtual void sum_over_ranks(double* values, int count) { (void)values, (void)count; }
  virtual void max_flags_over_ranks(float* values, int count) { (void)values, (void)count; }
  // agree_on_partials on host values: loss_flag is this rank's nonfinite_loss; out receives
  // found_inf, nonfinite_loss and the norm, agreed.
  void agree_on_partials_host(const std::vector<double>& partials, const std::vector<bool>& owned, float loss_flag,
                              float out[3]);

  const std::vector<Var>* sync_params_ = nullptr;
  ShardPlan shards_;  // owner empty: not sharded
  size_t bucket_bytes_ = size_t{25} << 20;
  double timeout_seconds_ = 300.0;
  int64_t gradient_syncs_ = 0;
  int64_t gradient_buckets_ = 0;
  int64_t buckets_during_backward_ = 0;
  int64_t buckets_done_in_backward_ = 0;
  int64_t gradient_bytes_ = 0;
  int64_t agreements_ = 0;
  double gradient_sync_seconds_ = 0.0;
  double gradient_wait_seconds_ = 0.0;
};

class LocalCommunicator final : public Communicator {
 public:
  int world_size() const override { return 1; }
  int rank() const override { return 0; }
  std::string name() const override { return "local"; }
  void all_reduce_gradients(const std::vector<Tensor*>&) override { ++gradient_syncs_; }
};

// `--dist NAME`: "local" (one process), "mpi" or "nccl" (started by mpirun; rank and world
// size from the launcher). Throws UsageError for an unknown name or one this build lacks.
std::unique_ptr<Communicator> make_communicator(const std::string& name);

}  // namespace belay
