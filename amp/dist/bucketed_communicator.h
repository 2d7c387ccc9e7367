// Gradient all-reduce in buckets, started while backward still runs (PyTorch DDP's scheme),
// over any transport that can start a reduction and complete it later (MPI_Iallreduce,
// NCCL on a second stream).
//
// The layout: the parameters in reverse order (backward reaches the last layer first),
// cut into buckets of about bucket_bytes of FP32 gradient; a parameter larger than that is
// a bucket of its own. The layout depends only on the parameters' sizes, so it is the same
// on every rank, and buckets are started strictly in layout order: every rank issues the
// same collectives in the same order, which MPI and NCCL both require. A bucket starts when
// the last of its gradients is final (backward's hook) and every bucket before it has
// started; what is left starts in finish, which then waits for all of them.
//
// The result is bit for bit the flat all-reduce's: each element is summed across ranks the
// same way whatever bucket it travels in (for two ranks a + b; with more ranks MPI's order
// could differ between message sizes, so MpiCommunicator then sums in rank order on each
// gradient's owner, slot_owner below: amp/dist/mpi_ordered.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "amp/dist/communicator.h"

namespace belay {

class BucketedCommunicator : public Communicator {
 public:
  void all_reduce_gradients(const std::vector<Tensor*>& grads) override;
  bool hooks_backward() const override { return true; }
  void begin_gradient_sync(const std::vector<Var>& params) override;
  void leaf_done(Node& leaf) override;
  void finish_gradient_sync() override;

 protected:
  struct Bucket {
    std::vector<size_t> slots;   // indices into the layout, in layout order
    int64_t numel = 0;           // FP32 elements of the whole bucket
    size_t ready = 0;            // slots whose gradient is final this step
    bool started = false;
    std::vector<Tensor*> grads;  // when started: the gradients to reduce (defined ones only)
    std::vector<size_t> grad_slots;  // the slot of each of grads
  };
  // The transport. start: begins reducing bucket `index` (its grads are set); it may return
  // before the data has moved. complete: returns when every started bucket holds the sum in
  // its gradient buffers (or, on a GPU, when the compute stream is ordered after it);
  // adds what it waited to gradient_wait_seconds_. progress: lets a transport without a
  // progress thread move data while backward runs (called from the hook).
  virtual void start_bucket(size_t index, Bucket& bucket) = 0;
  virtual void complete_buckets(std::vector<Bucket>& buckets) = 0;
  virtual void progress() {}
  // Bytes one element of `g` occupies on the wire.
  virtual size_t wire_bytes(const Tensor& g) const = 0;

  std::vector<Bucket> buckets_;

  // The rank that sums slot `slot`'s gradient in a reduction of defined order (a sharded run,
  // or an ordered all-reduce): the shard plan's owner, or else a plan made from the layout's
  // sizes (amp/dist/shard_plan.h), so that the owners spread the work alike on every rank.
  int slot_owner(size_t slot) const { return slot_owner_[slot]; }

  // Wall seconds from t0 to now (the sync and wait counters, the collectives' deadline).
  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  void lay_out(const std::vector<int64_t>& numels);
  void start_ready_buckets();
  void start_all_buckets();

  void assign_owners();

  std::vector<int64_t> layout_numels_;  // per slot, for the cached layout
  std::vector<int> slot_owner_;         // per slot
  int owners_from_shards_ = -1;         // whether slot_owner_ came from the shard plan
  std::vector<const Node*> layout_nodes_;
  std::unordered_map<const Node*, size_t> slot_of_;
  std::vector<size_t> bucket_of_slot_;
  std::vector<Tensor*> slot_grad_;      // per slot: the final gradient, or null
  std::vector<int64_t> scratch_numels_;  // kept: a steady step allocates nothing here
  std::vector<const Node*> scratch_nodes_;
  size_t layout_bucket_bytes_ = 0;
  size_t next_bucket_ = 0;
  bool in_backward_ = false;
};

}  // namespace belay
