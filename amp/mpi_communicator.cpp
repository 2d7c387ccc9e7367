#include "amp/mpi_communicator.h"

#include <mpi.h>

#include <cmath>
#include <cstring>

#include "engine/dtype.h"
#include "engine/error.h"

namespace belay {

namespace {
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed (error " + std::to_string(rc) + ")");
}
// MPI reads and writes host memory: the CUDA path needs NCCL (not done yet).
void require_cpu(const Tensor& t, const char* what) {
  if (t.device() != Device::cpu())
    throw UsageError(std::string("--dist mpi works on CPU tensors; ") + what + " is on " + t.device().str() +
                     " (NCCL for GPUs is not done yet)");
}
}  // namespace

MpiCommunicator::MpiCommunicator() {
  int initialised = 0;
  check(MPI_Initialized(&initialised), "MPI_Initialized");
  if (!initialised) {
    check(MPI_Init(nullptr, nullptr), "MPI_Init");
    owns_mpi_ = true;
  }
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (owns_mpi_ && !finalised) MPI_Finalize();
}

// Pack every gradient into one FP32 buffer (low-precision buffers widened exactly), sum
// across ranks, and write back (rounded once to the buffer's dtype). Each rank's gradients
// are already divided by the world size (SafeStep), so the sum is the whole batch's mean;
// summing in FP32 matches what one process does with an FP32 gradient buffer.
void MpiCommunicator::all_reduce_gradients(const std::vector<Tensor*>& grads) {
  size_t total = 0;
  for (const Tensor* g : grads) {
    require_cpu(*g, "a gradient");
    total += static_cast<size_t>(g->numel());
  }
  flat_.resize(total);
  size_t at = 0;
  for (const Tensor* g : grads) {
    const size_t n = static_cast<size_t>(g->numel());
    if (g->dtype() == DType::F32) {
      std::memcpy(flat_.data() + at, g->data(), n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) flat_[at + i] = load_as_f32(g->data(), g->dtype(), i);
    }
    at += n;
  }
  // MPI counts are int: one call per 2^30 elements at most.
  const size_t chunk = size_t{1} << 30;
  for (size_t off = 0; off < total; off += chunk) {
    const int count = static_cast<int>(std::min(chunk, total - off));
    check(MPI_Allreduce(MPI_IN_PLACE, flat_.data() + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce of the gradients");
  }
  at = 0;
  for (Tensor* g : grads) {
    const size_t n = static_cast<size_t>(g->numel());
    for (size_t i = 0; i < n; ++i) store_from_f32(g->data(), g->dtype(), i, flat_[at + i]);
    at += n;
  }
  ++gradient_syncs_;
  gradient_bytes_ += static_cast<int64_t>(total * sizeof(float));
}

void MpiCommunicator::agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) {
  for (const Tensor* t : {&found_inf, &nonfinite_loss, &norm}) {
    require_cpu(*t, "a guard scalar");
    if (t->dtype() != DType::F32 || t->numel() != 1) throw Error("agree_on_guard: needs one-element FP32 tensors");
  }
  float flags[2] = {*found_inf.data_as<float>(), *nonfinite_loss.data_as<float>()};
  check(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce of found_inf");
  // A NaN norm must survive the sum: MPI_SUM on doubles propagates NaN and inf as + does.
  const double local = static_cast<double>(*norm.data_as<float>());
  double sum_sq = local * local;  // exact: a float's square fits in a double
  check(MPI_Allreduce(MPI_IN_PLACE, &sum_sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce of the norm");
  *found_inf.data_as<float>() = flags[0];
  *nonfinite_loss.data_as<float>() = flags[1];
  *norm.data_as<float>() = static_cast<float>(std::sqrt(sum_sq / world_size_));
  agreements_ += 2;
}

void MpiCommunicator::average_loss(Tensor& loss) {
  require_cpu(loss, "the loss");
  if (loss.dtype() != DType::F32 || loss.numel() != 1) throw Error("average_loss: needs a one-element FP32 tensor");
  float v = *loss.data_as<float>();
  check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce of the loss");
  *loss.data_as<float>() = v / static_cast<float>(world_size_);
  ++agreements_;
}

int MpiCommunicator::max_over_ranks(int value) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce of a flag");
  ++agreements_;
  return value;
}

bool MpiCommunicator::replicas_agree(uint64_t checksum) {
  uint64_t lo = checksum, hi = checksum;
  check(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce of a checksum");
  check(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce of a checksum");
  agreements_ += 2;
  return lo == hi;
}

void MpiCommunicator::abort(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

}  // namespace belay
