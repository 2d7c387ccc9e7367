#include "amp/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
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
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (Tensor* g : bucket.grads)
    check_nccl(ncclAllReduce(g->data(), g->data(), static_cast<size_t>(g->numel()), nccl_type(g->dtype()), ncclSum,
                             s_->comm, s_->stream),
               "ncclAllReduce of a gradient bucket");
  // A non-blocking communicator may still be enqueueing the group: wait for it (deadline).
  const ncclResult_t rc = ncclGroupEnd();
  if (rc == ncclInProgress)
    wait_ready("ncclGroupEnd of a gradient bucket");
  else
    check_nccl(rc, "ncclGroupEnd");
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
  // Polled, not synchronised: a peer that hangs in NCCL holds this stream too, and the
  // deadline must still fire; NCCL's asynchronous error is read while waiting.
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t rc = cudaEventQuery(s_->copied);
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
