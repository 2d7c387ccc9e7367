#include "amp/dist/bucketed_communicator.h"

#include <algorithm>

#include "engine/error.h"

namespace belay {

// Slots in layout order; a bucket closes before the slot that would take it past the size.
void BucketedCommunicator::lay_out(const std::vector<int64_t>& numels) {
  layout_numels_ = numels;
  layout_bucket_bytes_ = bucket_bytes_;
  buckets_.clear();
  bucket_of_slot_.assign(numels.size(), 0);
  const int64_t limit = bucket_bytes_ == 0 ? INT64_MAX : static_cast<int64_t>(bucket_bytes_ / sizeof(float));
  for (size_t i = 0; i < numels.size(); ++i) {
    if (buckets_.empty() || (buckets_.back().numel > 0 && buckets_.back().numel + numels[i] > limit))
      buckets_.emplace_back();
    buckets_.back().slots.push_back(i);
    buckets_.back().numel += numels[i];
    bucket_of_slot_[i] = buckets_.size() - 1;
  }
  slot_grad_.assign(numels.size(), nullptr);
  owners_from_shards_ = -1;
  assign_owners();
}

// Slot i is parameter n-1-i (lay_out's order).
void BucketedCommunicator::assign_owners() {
  const int from_shards = sharded() ? 1 : 0;
  if (owners_from_shards_ == from_shards && slot_owner_.size() == layout_numels_.size()) return;
  const size_t n = layout_numels_.size();
  std::vector<int> owner;
  if (sharded()) {
    if (shards_.owner.size() != n)
      throw Error("gradient sync: the shard plan has " + std::to_string(shards_.owner.size()) +
                  " parameters, the optimizer " + std::to_string(n));
    owner = shards_.owner;
  } else {
    owner = plan_shards(std::vector<int64_t>(layout_numels_.rbegin(), layout_numels_.rend()), world_size()).owner;
  }
  slot_owner_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) slot_owner_[i] = owner[n - 1 - i];
  owners_from_shards_ = from_shards;
}

void BucketedCommunicator::begin_gradient_sync(const std::vector<Var>& params) {
  const auto t0 = std::chrono::steady_clock::now();
  sync_params_ = &params;
  // Slot i is parameter n-1-i: backward produces the last layer's gradients first.
  scratch_numels_.clear();
  scratch_nodes_.clear();
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    scratch_numels_.push_back(it->value().numel());
    scratch_nodes_.push_back(it->node());
  }
  if (scratch_numels_ != layout_numels_ || bucket_bytes_ != layout_bucket_bytes_) lay_out(scratch_numels_);
  if (scratch_nodes_ != layout_nodes_) {
    layout_nodes_ = scratch_nodes_;
    slot_of_.clear();
    for (size_t i = 0; i < layout_nodes_.size(); ++i) slot_of_[layout_nodes_[i]] = i;
  }
  assign_owners();  // a plan set since the layout was made
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.started = false;
  }
  std::fill(slot_grad_.begin(), slot_grad_.end(), nullptr);
  next_bucket_ = 0;
  in_backward_ = true;
  gradient_sync_seconds_ += seconds_since(t0);
}

void BucketedCommunicator::leaf_done(Node& leaf) {
  if (!in_backward_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const auto it = slot_of_.find(&leaf);
  if (it == slot_of_.end()) return;  // a leaf that is not a parameter (an input that requires grad)
  const size_t slot = it->second;
  if (slot_grad_[slot]) return;  // already counted
  slot_grad_[slot] = &leaf.grad;
  ++buckets_[bucket_of_slot_[slot]].ready;
  start_ready_buckets();
  progress();  // once per parameter: the buckets in flight move while backward runs
  gradient_sync_seconds_ += seconds_since(t0);
}

void BucketedCommunicator::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready == buckets_[next_bucket_].slots.size()) {
    Bucket& b = buckets_[next_bucket_];
    b.grads.clear();
    b.grad_slots.clear();
    for (size_t slot : b.slots)
      if (slot_grad_[slot] && slot_grad_[slot]->defined()) {
        gradient_bytes_ += static_cast<int64_t>(slot_grad_[slot]->numel() * wire_bytes(*slot_grad_[slot]));
        b.grads.push_back(slot_grad_[slot]);
        b.grad_slots.push_back(slot);
      }
    b.started = true;
    start_bucket(next_bucket_, b);
    ++gradient_buckets_;
    if (in_backward_) ++buckets_during_backward_;
    ++next_bucket_;
    progress();  // the buckets before it move while this one's successor is packed
  }
}

// What the hook did not mark (a parameter the last micro-batch did not reach keeps the
// gradient of the earlier ones, final since before this backward) is final now.
void BucketedCommunicator::start_all_buckets() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t slot : buckets_[b].slots)
      if (!slot_grad_[slot]) {
        slot_grad_[slot] = &(*sync_params_)[sync_params_->size() - 1 - slot].node()->grad;
        ++buckets_[b].ready;
      }
  start_ready_buckets();
}

void BucketedCommunicator::finish_gradient_sync() {
  const auto t0 = std::chrono::steady_clock::now();
  if (!sync_params_) throw Error("finish_gradient_sync without begin_gradient_sync");
  in_backward_ = false;
  start_all_buckets();
  complete_buckets(buckets_);
  ++gradient_syncs_;
  sync_params_ = nullptr;
  gradient_sync_seconds_ += seconds_since(t0);
}

// Without the hook: the given buffers, in the same layout (reverse order), all final now.
void BucketedCommunicator::all_reduce_gradients(const std::vector<Tensor*>& grads) {
  // A shard plan names parameters; these buffers are not known to be the optimizer's.
  if (sharded()) throw Error("all_reduce_gradients: a sharded sync goes through begin/finish_gradient_sync");
  const auto t0 = std::chrono::steady_clock::now();
  scratch_numels_.clear();
  for (auto it = grads.rbegin(); it != grads.rend(); ++it) scratch_numels_.push_back((*it)->numel());
  if (scratch_numels_ != layout_numels_ || bucket_bytes_ != layout_bucket_bytes_) lay_out(scratch_numels_);
  for (size_t i = 0; i < grads.size(); ++i) slot_grad_[i] = grads[grads.size() - 1 - i];
  for (Bucket& b : buckets_) {
    b.ready = b.slots.size();
    b.started = false;
  }
  next_bucket_ = 0;
  in_backward_ = false;
  start_ready_buckets();
  complete_buckets(buckets_);
  ++gradient_syncs_;
  gradient_sync_seconds_ += seconds_since(t0);
}

}  // namespace belay
