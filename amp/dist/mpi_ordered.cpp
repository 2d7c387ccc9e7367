// MpiCommunicator's reduction of defined order, and the rest of a sharded optimizer's traffic
// (amp/dist/mpi_communicator.h): the gradient sums on their owners, the parameters from
// their owners after the step, a checkpoint's state to rank 0, and the belts' small sums.
//
// Why not MPI_Iallreduce / MPI_Ireduce_scatter: MPI leaves the order of a sum to the library
// (it may change with the message size or the number of ranks), and a sharded run could then
// not give the unsharded run's bits. Here gradient t's owner adds the ranks' copies in rank
// order, s = ((c0 + c1) + c2) + ..., in FP32, and rounds once to the buffer's dtype: the
// same bits whichever rank owns t, and whether or not the optimizer is sharded.
// What it costs: the owner receives N-1 copies of what it owns (a ring moves 2 (N-1)/N of
// the data per rank and sums on the way); the receive buffers are kept per bucket.
#include <climits>
#include <cstring>

#include "amp/dist/mpi_communicator.h"
#include "engine/dtype.h"
#include "engine/error.h"

namespace belay {

namespace {
// Point-to-point tags: a gradient message carries its bucket's index (buckets in flight at
// once never share one); a checkpoint's gather uses the tag above them.
constexpr int kGatherTag = 32767;
int bucket_tag(size_t index) { return static_cast<int>(index % 32767); }

int mpi_count(int64_t n, const char* what) {
  if (n > INT_MAX) throw Error(std::string(what) + ": " + std::to_string(n) + " elements, over MPI's int count");
  return static_cast<int>(n);
}
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed (error " + std::to_string(rc) + ")");
}
void require_cpu_tensor(const Tensor& t) {
  if (t.device() != Device::cpu())
    throw UsageError("--dist mpi works on CPU tensors; a parameter is on " + t.device().str() + " (use --dist nccl)");
}
}  // namespace

// Every rank walks the bucket's gradients in the same order: a gradient goes to its owner,
// and the owner posts one receive per peer. MPI keeps the order of messages between two
// ranks with one tag, so each receive matches its gradient.
void MpiCommunicator::start_ordered(size_t index, Bucket& bucket, Flight& f) {
  size_t recv_n = 0, widen_n = 0;
  for (size_t k = 0; k < bucket.grads.size(); ++k) {
    const size_t n = static_cast<size_t>(bucket.grads[k]->numel());
    if (bucket.grads[k]->dtype() != DType::F32) widen_n += n;
    if (slot_owner(bucket.grad_slots[k]) == rank_) recv_n += n * static_cast<size_t>(world_size_ - 1);
  }
  f.recv.resize(recv_n);
  f.widened.resize(widen_n);
  std::lock_guard<std::mutex> lock(mpi_mutex_);
  f.requests.clear();
  size_t at_recv = 0, at_widen = 0;
  const int tag = bucket_tag(index);
  for (size_t k = 0; k < bucket.grads.size(); ++k) {
    const Tensor& g = *bucket.grads[k];
    const int n = mpi_count(g.numel(), "a gradient");
    const int owner = slot_owner(bucket.grad_slots[k]);
    const float* src = g.data_as<float>();
    if (g.dtype() != DType::F32) {  // widened exactly; the sum is rounded once on the way back
      for (int i = 0; i < n; ++i) f.widened[at_widen + i] = load_as_f32(g.data(), g.dtype(), i);
      src = f.widened.data() + at_widen;
      at_widen += static_cast<size_t>(n);
    }
    if (owner != rank_) {
      f.requests.emplace_back();
      check(MPI_Isend(src, n, MPI_FLOAT, owner, tag, MPI_COMM_WORLD, &f.requests.back()), "MPI_Isend of a gradient");
      continue;
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      f.requests.emplace_back();
      check(MPI_Irecv(f.recv.data() + at_recv, n, MPI_FLOAT, r, tag, MPI_COMM_WORLD, &f.requests.back()),
            "MPI_Irecv of a gradient");
      at_recv += static_cast<size_t>(n);
    }
  }
  f.active = true;
  ++active_flights_;
  progress_wake_.notify_one();
}

// The requests are complete. On the owner: s = c0 + c1 + ... in rank order, its own copy at
// its place, rounded once into the gradient buffer. Unsharded, every gradient of the bucket
// is then broadcast from its owner (its bytes, in the buffer's dtype).
void MpiCommunicator::finish_ordered(Bucket& bucket, Flight& f, std::vector<MPI_Request>& broadcasts) {
  size_t at_recv = 0, at_widen = 0;
  std::vector<float>& sum = ordered_sum_;
  for (size_t k = 0; k < bucket.grads.size(); ++k) {
    Tensor& g = *bucket.grads[k];
    const size_t n = static_cast<size_t>(g.numel());
    const float* own = g.dtype() == DType::F32 ? g.data_as<float>() : f.widened.data() + at_widen;
    if (g.dtype() != DType::F32) at_widen += n;
    if (slot_owner(bucket.grad_slots[k]) != rank_) continue;
    sum.assign(n, 0.0f);
    size_t peer = 0;
    for (int r = 0; r < world_size_; ++r) {
      const float* c = r == rank_ ? own : f.recv.data() + at_recv + (peer++) * n;
      if (r == 0) std::memcpy(sum.data(), c, n * sizeof(float));
      else for (size_t i = 0; i < n; ++i) sum[i] += c[i];
    }
    at_recv += n * static_cast<size_t>(world_size_ - 1);
    if (g.dtype() == DType::F32) std::memcpy(g.data(), sum.data(), n * sizeof(float));
    else for (size_t i = 0; i < n; ++i) store_from_f32(g.data(), g.dtype(), i, sum[i]);
  }
  if (sharded()) return;  // each owner keeps its sums: the optimizer reads only those
  std::lock_guard<std::mutex> lock(mpi_mutex_);
  for (size_t k = 0; k < bucket.grads.size(); ++k) {
    Tensor& g = *bucket.grads[k];
    broadcasts.emplace_back();
    check(MPI_Ibcast(g.data(), mpi_count(static_cast<int64_t>(g.nbytes()), "a gradient's bytes"), MPI_BYTE,
                     slot_owner(bucket.grad_slots[k]), MPI_COMM_WORLD, &broadcasts.back()),
          "MPI_Ibcast of a gradient sum");
  }
}

// After the step: parameter i's value (the working copy, or the FP32 weights themselves) from
// its owner, which alone updated it. Every rank, every step, skipped or not (the owner then
// sends what every rank already holds: the decision needs no host read to be taken alike).
void MpiCommunicator::all_gather_params(const std::vector<Var>& params) {
  if (world_size_ == 1) return;
  if (shards_.owner.size() != params.size()) throw Error("all_gather_params: the shard plan does not fit the parameters");
  std::vector<MPI_Request> requests(params.size());
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& value = params[i].node()->value;
      require_cpu_tensor(value);
      check(MPI_Ibcast(value.data(), mpi_count(static_cast<int64_t>(value.nbytes()), "a parameter's bytes"), MPI_BYTE,
                       shards_.owner[i], MPI_COMM_WORLD, &requests[i]),
            "MPI_Ibcast of a parameter");
    }
  }
  wait(requests.data(), static_cast<int>(requests.size()), "the all-gather of the updated parameters");
}

void MpiCommunicator::gather_to_root(Tensor& t, int owner) {
  if (owner == 0 || (rank_ != 0 && rank_ != owner)) return;
  require_cpu_tensor(t);
  MPI_Request request;
  const int bytes = mpi_count(static_cast<int64_t>(t.nbytes()), "a checkpoint tensor's bytes");
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    if (rank_ == 0)
      check(MPI_Irecv(t.data(), bytes, MPI_BYTE, owner, kGatherTag, MPI_COMM_WORLD, &request), "MPI_Irecv of state");
    else
      check(MPI_Isend(t.data(), bytes, MPI_BYTE, 0, kGatherTag, MPI_COMM_WORLD, &request), "MPI_Isend of state");
  }
  wait(&request, 1, "the gather of the sharded optimizer state to rank 0");
}

std::vector<double> MpiCommunicator::all_gather_value(double value) {
  std::vector<double> all(static_cast<size_t>(world_size_));
  MPI_Request request;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    check(MPI_Iallgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD, &request),
          "MPI_Iallgather");
  }
  wait(&request, 1, "an all-gather of one value per rank");
  return all;
}

// Each entry has one non-zero term but for non-finite ones (agree_on_partials), so the
// library's order cannot change the bits.
void MpiCommunicator::sum_over_ranks(double* values, int count) {
  all_reduce_host(values, count, MPI_DOUBLE, MPI_SUM, "the agreement on the gradient norm");
}

void MpiCommunicator::max_flags_over_ranks(float* values, int count) {
  all_reduce_host(values, count, MPI_FLOAT, MPI_MAX, "the agreement on found_inf");
}

}  // namespace belay
