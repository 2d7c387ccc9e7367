#include "amp/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>

#include "engine/dtype.h"
#include "engine/error.h"

namespace belay {

namespace {
void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(rc));
}
void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw Error(std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(rc));
}
ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
  }
  throw Error("NCCL: no NCCL type for this dtype");
}
void require_cuda(const Tensor& t, const char* what) {
  if (!t.device().is_cuda())
    throw UsageError(std::string("--dist nccl works on GPU tensors; ") + what + " is on " + t.device().str() +
                     " (use --device cuda, or --dist mpi on the CPU)");
}
}  // namespace

struct NcclCommunicator::State {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;   // the second stream: the gradient buckets
  cudaEvent_t produced = nullptr;  // on the compute stream: the bucket's gradients are enqueued before it
  cudaEvent_t reduced = nullptr;   // on the NCCL stream: every bucket has been summed
  cudaEvent_t copied = nullptr;    // on the compute stream: the scalars reached the pinned buffer
  float* pinned = nullptr;         // 4 floats of page-locked host memory
  char* flat = nullptr;            // sharded: the packed buffer of the reduce-scatter and all-gather
  size_t flat_bytes = 0;
  std::vector<char*> retired;      // smaller packed buffers, freed with the communicator
};

NcclCommunicator::NcclCommunicator() : s_(std::make_unique<State>()) {}

// The device is the rank's index among the ranks on its node. Every rank decides together: a
// rank that threw alone would leave the others in NCCL's init.
void NcclCommunicator::choose_device() {
  int gpus = 0;
  const cudaError_t rc = cudaGetDeviceCount(&gpus);
  const int missing = (rc != cudaSuccess || gpus == 0) ? 1 : 0;
  if (max_over_ranks(missing) != 0) {
    throw UsageError(missing ? std::string("--dist nccl needs a GPU for every rank, and rank ") + std::to_string(rank()) +
                                   " sees none (" + (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") +
                                   "); use --dist mpi on the CPU"
                             : std::string("--dist nccl needs a GPU for every rank, and another rank sees none; "
                                           "use --dist mpi on the CPU"));
  }
  MPI_Comm node;
  int local_rank = 0, local_size = 1;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node) != MPI_SUCCESS)
      throw Error("MPI: MPI_Comm_split_type (the ranks of this node) failed");
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
  }
  // The most crowded node, the same on every rank, so that rank 0 says it for all.
  const int crowded = max_over_ranks(local_size > gpus ? local_size * 65536 + gpus : 0);
  if (crowded != 0)
    throw UsageError("--dist nccl: " + std::to_string(crowded / 65536) + " ranks on a node with " +
                     std::to_string(crowded % 65536) + " GPU(s): two ranks would share a GPU (each rank takes the GPU "
                     "of its index on its node); start at most one rank per GPU (mpirun --npernode " +
                     std::to_string(crowded % 65536) + ")");
  s_->device = local_rank;
  check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
}

bool NcclCommunicator::check_async_error(const char* what) {
  ncclResult_t state = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(s_->comm, &state), "ncclCommGetAsyncError");
  if (state == ncclSuccess) return false;
  if (state == ncclInProgress) return true;
  ncclCommAbort(s_->comm);  // NCCL's kernels may wait for a peer forever: end them
  s_->comm = nullptr;
  throw Error(std::string("NCCL: asynchronous error in ") + what + ": " + ncclGetErrorString(state) +
              " (the NCCL communicator was aborted; stopping every rank)");
}

void NcclCommunicator::wait_ready(const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  while (check_async_error(what)) {
    if (seconds_since(t0) > timeout_seconds_) {
      ncclCommAbort(s_->comm);
      s_->comm = nullptr;
      check_deadline(t0, what);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclCommunicator::connect() {
  choose_device();
  ncclUniqueId id;
  if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Request request;
  if (MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &request) != MPI_SUCCESS)
    throw Error("MPI: MPI_Ibcast of the NCCL unique id failed");
  wait(&request, 1, "the broadcast of the NCCL unique id");
  // Non-blocking: a peer that never joins must not hang this rank past --dist-timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&s_->comm, world_size(), id, rank(), &config);
  if (rc != ncclInProgress) check_nccl(rc, "ncclCommInitRankConfig");
  wait_ready("NCCL's init (ncclCommInitRankConfig)");
  check_cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&s_->produced, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&s_->reduced, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&s_->copied, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&s_->pinned), 4 * sizeof(float)), "cudaMallocHost");
}

// Nothing here may throw: handles are released as far as they were made.
NcclCommunicator::~NcclCommunicator() {
  if (s_->comm) ncclCommDestroy(s_->comm);
  if (s_->pinned) cudaFreeHost(s_->pinned);
  if (s_->stream) cudaStreamSynchronize(s_->stream);  // nothing queued may still read a packed buffer
  for (char* p : s_->retired) cudaFree(p);
  if (s_->flat) cudaFree(s_->flat);
  for (cudaEvent_t e : {s_->produced, s_->reduced, s_->copied})
    if (e) cudaEventDestroy(e);
  if (s_->stream) cudaStreamDestroy(s_->stream);
}

size_t NcclCommunicator::wire_bytes(const Tensor& g) const { return dtype_size(g.dtype()); }

// The bucket's gradients were enqueued on the compute stream (the legacy default stream the
// CUDA backend uses) before this call: the event orders the reduction after them, in place.
void NcclCommunicator::start_bucket(size_t /*index*/, Bucket& bucket) {
  for (const Tensor* g : bucket.grads) require_cuda(*g, "a gradient");
  check_cuda(cudaEventRecord(s_->produced, nullptr), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(s_->stream, s_->produced, 0), "cudaStreamWaitEvent");
  if (sharded()) return reduce_scatter_bucket(bucket);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (Tensor* g : bucket.grads)
    check_nccl(ncclAllReduce(g->data(), g->data(), static_cast<size_t>(g->numel()), nccl_type(g->dtype()), ncclSum,
                             s_->comm, s_->stream),
               "ncclAllReduce of a gradient bucket");
  group_end("ncclGroupEnd of a gradient bucket");
}

// A non-blocking communicator may still be enqueueing the group: wait for it (deadline).
void NcclCommunicator::group_end(const char* what) {
  const ncclResult_t rc = ncclGroupEnd();
  if (rc == ncclInProgress)
    wait_ready(what);
  else
    check_nccl(rc, "ncclGroupEnd");
}

char* NcclCommunicator::flat(size_t bytes) {
  if (bytes > s_->flat_bytes) {
    if (s_->flat) s_->retired.push_back(s_->flat);
    s_->flat = nullptr;
    s_->flat_bytes = 0;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&s_->flat), bytes), "cudaMalloc of the packed buffer of a sharded bucket");
    s_->flat_bytes = bytes;
  }
  return s_->flat;
}

namespace {
// One packed collective's layout: per rank, the indices of the tensors it owns (in order)
// and their elements; block = the most any rank owns (each rank's block is padded to it).
struct Blocks {
  std::vector<std::vector<size_t>> mine;
  size_t block = 0;
};
template <class OwnerOf, class NumelOf>
Blocks lay_out_blocks(const std::vector<size_t>& members, int world, OwnerOf owner_of, NumelOf numel_of) {
  Blocks b;
  b.mine.assign(static_cast<size_t>(world), {});
  std::vector<size_t> elems(static_cast<size_t>(world), 0);
  for (size_t k : members) {
    const int o = owner_of(k);
    b.mine[static_cast<size_t>(o)].push_back(k);
    elems[static_cast<size_t>(o)] += numel_of(k);
  }
  b.block = *std::max_element(elems.begin(), elems.end());
  return b;
}
}  // namespace

// The bucket's gradients, one packed reduce-scatter per dtype among them (FP32 by default,
// the compute dtype with --grad-dtype compute): every gradient copied into its owner's block,
// the padding zeroed, the blocks summed, this rank's block copied back into its gradients.
// All on the NCCL stream, after the event start_bucket recorded: the host never waits.
void NcclCommunicator::reduce_scatter_bucket(Bucket& bucket) {
  const int n = world_size();
  std::vector<DType> dtypes;
  for (const Tensor* g : bucket.grads)
    if (std::find(dtypes.begin(), dtypes.end(), g->dtype()) == dtypes.end()) dtypes.push_back(g->dtype());
  for (DType dt : dtypes) {
    std::vector<size_t> members;
    for (size_t k = 0; k < bucket.grads.size(); ++k)
      if (bucket.grads[k]->dtype() == dt) members.push_back(k);
    const Blocks b = lay_out_blocks(
        members, n, [&](size_t k) { return slot_owner(bucket.grad_slots[k]); },
        [&](size_t k) { return static_cast<size_t>(bucket.grads[k]->numel()); });
    if (b.block == 0) continue;
    const size_t es = dtype_size(dt), block_bytes = b.block * es;
    char* buf = flat(block_bytes * static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      size_t at = static_cast<size_t>(r) * block_bytes;
      for (size_t k : b.mine[static_cast<size_t>(r)]) {
        const Tensor& g = *bucket.grads[k];
        check_cuda(cudaMemcpyAsync(buf + at, g.data(), g.nbytes(), cudaMemcpyDeviceToDevice, s_->stream),
                   "cudaMemcpyAsync (packing a gradient bucket)");
        at += g.nbytes();
      }
      const size_t end = static_cast<size_t>(r + 1) * block_bytes;
      if (at < end) check_cuda(cudaMemsetAsync(buf + at, 0, end - at, s_->stream), "cudaMemsetAsync (padding)");
    }
    char* own = buf + static_cast<size_t>(rank()) * block_bytes;
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclReduceScatter(buf, own, b.block, nccl_type(dt), ncclSum, s_->comm, s_->stream),
               "ncclReduceScatter of a gradient bucket");
    group_end("ncclGroupEnd of a gradient bucket's reduce-scatter");
    size_t at = 0;
    for (size_t k : b.mine[static_cast<size_t>(rank())]) {
      Tensor& g = *bucket.grads[k];
      check_cuda(cudaMemcpyAsync(g.data(), own + at, g.nbytes(), cudaMemcpyDeviceToDevice, s_->stream),
                 "cudaMemcpyAsync (unpacking a gradient bucket)");
      at += g.nbytes();
    }
  }
}

// After the step (every rank, every step): parameter i's working copy (or FP32 value) from
// its owner. Chunks of the parameters in order, closed at --bucket-mb or where the dtype
// changes; in each, this rank packs its own parameters into its block, ncclAllGather (in
// place) fills the others' blocks, and each parameter another rank owns is copied out of its
// owner's block. On the NCCL stream, ordered after the step's kernels; the compute stream
// waits for it, and so does the host, polling with the deadline (below).
void NcclCommunicator::all_gather_params(const std::vector<Var>& params) {
  if (world_size() == 1) return;
  if (shards_.owner.size() != params.size()) throw Error("all_gather_params: the shard plan does not fit the parameters");
  for (const Var& p : params) require_cuda(p.node()->value, "a parameter");
  check_cuda(cudaEventRecord(s_->produced, nullptr), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(s_->stream, s_->produced, 0), "cudaStreamWaitEvent");
  const int n = world_size();
  const size_t limit = bucket_bytes_ == 0 ? SIZE_MAX : bucket_bytes_;
  auto value = [&](size_t i) -> Tensor& { return params[i].node()->value; };
  size_t first = 0;
  while (first < params.size()) {
    std::vector<size_t> chunk{first};
    size_t bytes = value(first).nbytes();
    const DType dt = value(first).dtype();
    size_t next = first + 1;
    for (; next < params.size() && value(next).dtype() == dt && bytes + value(next).nbytes() <= limit; ++next) {
      chunk.push_back(next);
      bytes += value(next).nbytes();
    }
    first = next;
    const Blocks b = lay_out_blocks(
        chunk, n, [&](size_t i) { return shards_.owner[i]; },
        [&](size_t i) { return static_cast<size_t>(value(i).numel()); });
    if (b.block == 0) continue;
    const size_t es = dtype_size(dt), block_bytes = b.block * es;
    char* buf = flat(block_bytes * static_cast<size_t>(n));
    char* own = buf + static_cast<size_t>(rank()) * block_bytes;
    size_t at = 0;
    for (size_t i : b.mine[static_cast<size_t>(rank())]) {
      check_cuda(cudaMemcpyAsync(own + at, value(i).data(), value(i).nbytes(), cudaMemcpyDeviceToDevice, s_->stream),
                 "cudaMemcpyAsync (packing parameters)");
      at += value(i).nbytes();
    }
    if (at < block_bytes) check_cuda(cudaMemsetAsync(own + at, 0, block_bytes - at, s_->stream), "cudaMemsetAsync (padding)");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclAllGather(own, buf, b.block, nccl_type(dt), s_->comm, s_->stream),
               "ncclAllGather of the updated parameters");
    group_end("ncclGroupEnd of the parameters' all-gather");
    for (int r = 0; r < n; ++r) {
      if (r == rank()) continue;
      size_t from = static_cast<size_t>(r) * block_bytes;
      for (size_t i : b.mine[static_cast<size_t>(r)]) {
        check_cuda(cudaMemcpyAsync(value(i).data(), buf + from, value(i).nbytes(), cudaMemcpyDeviceToDevice, s_->stream),
                   "cudaMemcpyAsync (unpacking parameters)");
        from += value(i).nbytes();
      }
    }
  }
  check_cuda(cudaEventRecord(s_->reduced, s_->stream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(nullptr, s_->reduced, 0), "cudaStreamWaitEvent");
  // The host waits for the gather here, with the deadline: every host read that follows (the
  // CSV's scalars, a checkpoint's checksum) is a plain copy that would otherwise wait without
  // one for a peer that died inside the all-gather. The price: the next step's kernels are
  // queued only once the gather has ended (unsharded, the loss's read waits likewise, for the
  // all-reduce).
  wait_for_event(s_->reduced, "the all-gather of the updated parameters (waiting for this GPU)");
}

// A checkpoint's tensor from its owner to rank 0 over MPI, through host memory (a GPU
// tensor is copied out on the owner and back in on rank 0; Tensor's copies wait for the GPU).
void NcclCommunicator::gather_to_root(Tensor& t, int owner) {
  if (owner == 0 || (rank() != 0 && rank() != owner)) return;
  if (t.device() == Device::cpu()) return MpiCommunicator::gather_to_root(t, owner);
  Tensor host = rank() == owner ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  MpiCommunicator::gather_to_root(host, owner);
  if (rank() == 0) t.copy_from(host);
}

// Sharded: this rank's non-finite-loss flag out, the agreement over MPI, the three scalars
// back (as agree_on_guard, with the guard's per-tensor sums already on the host).
void NcclCommunicator::agree_on_partials(const std::vector<double>& partials, const std::vector<bool>& owned,
                                         Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) {
  read_scalars({&nonfinite_loss}, "the agreement on found_inf and the norm (waiting for this GPU)");
  float out[3];
  agree_on_partials_host(partials, owned, s_->pinned[0], out);
  std::copy(out, out + 3, s_->pinned);
  write_scalars({&found_inf, &nonfinite_loss, &norm});
}

// The compute stream waits for the last bucket (and so for all: one stream, in order).
void NcclCommunicator::complete_buckets(std::vector<Bucket>& buckets) {
  for (size_t b = 0; b < buckets.size(); ++b)
    if (!buckets[b].started) throw Error("complete_buckets: bucket " + std::to_string(b) + " was never started");
  check_cuda(cudaEventRecord(s_->reduced, s_->stream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(nullptr, s_->reduced, 0), "cudaStreamWaitEvent");
}

void NcclCommunicator::read_scalars(const std::vector<Tensor*>& scalars, const char* what) {
  for (size_t i = 0; i < scalars.size(); ++i) {
    require_cuda(*scalars[i], "a guard scalar");
    if (scalars[i]->dtype() != DType::F32 || scalars[i]->numel() != 1)
      throw Error("NCCL: the belts' agreement needs one-element FP32 tensors");
    check_cuda(cudaMemcpyAsync(s_->pinned + i, scalars[i]->data(), sizeof(float), cudaMemcpyDeviceToHost, nullptr),
               "cudaMemcpyAsync");
  }
  check_cuda(cudaEventRecord(s_->copied, nullptr), "cudaEventRecord");
  wait_for_event(s_->copied, what);
}

// Polled, not synchronised: a peer that hangs in NCCL holds this stream too, and the
// deadline must still fire; NCCL's asynchronous error is read while waiting.
void NcclCommunicator::wait_for_event(void* event, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) check_cuda(rc, "cudaEventQuery");
    // "Not yet" is recorded as the thread's last error too: left there, the backend's next
    // launch check would take it for a failed launch (as kernels/cuda/pinned_transfers.cpp says).
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    check_async_error(what);
    check_deadline(t0, what);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::write_scalars(const std::vector<Tensor*>& scalars) {
  for (size_t i = 0; i < scalars.size(); ++i)
    check_cuda(cudaMemcpyAsync(scalars[i]->data(), s_->pinned + i, sizeof(float), cudaMemcpyHostToDevice, nullptr),
               "cudaMemcpyAsync");
}

void NcclCommunicator::agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) {
  const std::vector<Tensor*> scalars{&found_inf, &nonfinite_loss, &norm};
  read_scalars(scalars, "the agreement on found_inf and the norm (waiting for this GPU)");
  float flags[2] = {s_->pinned[0], s_->pinned[1]};
  all_reduce_host(flags, 2, MPI_FLOAT, MPI_MAX, "the agreement on found_inf");
  const double local = static_cast<double>(s_->pinned[2]);
  double sum_sq = local * local;  // as over MPI: NaN and inf survive the sum
  all_reduce_host(&sum_sq, 1, MPI_DOUBLE, MPI_SUM, "the agreement on the gradient norm");
  s_->pinned[0] = flags[0];
  s_->pinned[1] = flags[1];
  s_->pinned[2] = static_cast<float>(std::sqrt(sum_sq / world_size()));
  write_scalars(scalars);
  agreements_ += 2;
}

void NcclCommunicator::average_loss(Tensor& loss) {
  const std::vector<Tensor*> scalars{&loss};
  read_scalars(scalars, "the all-reduce of the loss (waiting for this GPU)");
  float v = s_->pinned[0];
  all_reduce_host(&v, 1, MPI_FLOAT, MPI_SUM, "the all-reduce of the loss");
  s_->pinned[0] = v / static_cast<float>(world_size());
  write_scalars(scalars);
  ++agreements_;
}

// NCCL's kernels may be waiting for a dead peer: abort the communicator before MPI ends the job.
void NcclCommunicator::abort(int exit_code) {
  if (s_->comm) ncclCommAbort(s_->comm);
  s_->comm = nullptr;
  MpiCommunicator::abort(exit_code);
}

}  // namespace belay
