#include "amp/dist/mpi_communicator.h"

#include <sched.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "engine/dtype.h"
#include "engine/error.h"

// Defined only in a build measuring line coverage (clang's profile runtime); null elsewhere.
extern "C" int __llvm_profile_write_file(void) __attribute__((weak));

namespace belay {

namespace {
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {0};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error(std::string("MPI: ") + what + " failed: " + text);
  }
}
// MPI reads and writes host memory: GPU tensors go through --dist nccl.
void require_cpu(const Tensor& t, const char* what) {
  if (t.device() != Device::cpu())
    throw UsageError(std::string("--dist mpi works on CPU tensors; ") + what + " is on " + t.device().str() +
                     " (use --dist nccl for GPUs)");
}
}  // namespace

MpiCommunicator::MpiCommunicator() {
  int initialised = 0;
  check(MPI_Initialized(&initialised), "MPI_Initialized");
  if (!initialised) {
    // SERIALIZED: the progress thread calls MPI too, never at the same time (mpi_mutex_).
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &thread_level_), "MPI_Init_thread");
    owns_mpi_ = true;
  } else {
    check(MPI_Query_thread(&thread_level_), "MPI_Query_thread");
  }
  // Errors come back as codes (check() turns them into belay errors) instead of MPI's
  // default of aborting the job with its own message.
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  stop_progress_thread();
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (owns_mpi_ && !finalised) MPI_Finalize();
}

void MpiCommunicator::check_deadline(std::chrono::steady_clock::time_point since, const char* what) const {
  if (seconds_since(since) <= timeout_seconds_) return;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout_seconds_);
  throw Error(std::string("no answer from the other ranks for ") + secs + " s in " + what +
              ": a rank has died or hangs; stopping every rank (--dist-timeout " + secs + ")");
}

// Spin first (a small reduction between processes on one machine completes within
// microseconds), then yield between tests (on a machine with fewer cores than ranks the peer
// may need this core), and only after 100 ms sleep between them: OpenMPI moves a large
// message only while this process tests it, so sleeping early would slow the transfer, but
// a peer that is busy for long (writing a checkpoint) or gone should not cost a core.
void MpiCommunicator::wait(MPI_Request* requests, int count, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long polls = 0;; ++polls) {
    int done = 0;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex_);
      check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), what);
    }
    if (done) return;
    if (polls < 2000) continue;
    check_deadline(t0, what);
    if (seconds_since(t0) < 0.1)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void MpiCommunicator::all_reduce_host(void* buffer, int count, MPI_Datatype type, MPI_Op op, const char* what) {
  MPI_Request request;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    check(MPI_Iallreduce(MPI_IN_PLACE, buffer, count, type, op, MPI_COMM_WORLD, &request), what);
  }
  wait(&request, 1, what);
}

// Large FP32 gradients are summed in place, each by its own MPI_Iallreduce (no copy in and
// out); the others (small ones, whose calls would cost more than the copy, and FP16/BF16
// buffers, widened exactly) are packed into the bucket's FP32 buffer and summed in one call.
// Each rank's gradients are already divided by the world size (SafeStep), so the sum is the
// whole batch's mean; summing in FP32 matches what one process does with an FP32 gradient
// buffer, and the split into calls is the same on every rank (it depends on sizes only).
namespace {
constexpr int64_t kInPlaceMin = 4096;  // elements: 16 KB, well past MPI's latency-bound sizes
bool in_place(const Tensor& g) { return g.dtype() == DType::F32 && g.numel() >= kInPlaceMin; }
}  // namespace

void MpiCommunicator::start_bucket(size_t index, Bucket& bucket) {
  if (flights_.size() < buckets_.size()) {
    std::lock_guard<std::mutex> lock(mpi_mutex_);  // the progress thread walks flights_
    flights_.resize(buckets_.size());
  }
  Flight& f = flights_[index];  // inactive: the progress thread leaves it alone
  size_t packed = 0;
  for (const Tensor* g : bucket.grads) {
    require_cpu(*g, "a gradient");
    if (!in_place(*g)) packed += static_cast<size_t>(g->numel());
  }
  // One rank (mpirun -np 1): the sum over ranks is the gradient itself, to the bit (FP16
  // and BF16 widen to FP32 exactly and round back to themselves): nothing to move.
  if (world_size_ == 1) return;
  if (ordered()) {
    start_ordered(index, bucket, f);
    return;
  }
  f.staging.resize(packed);
  size_t at = 0;
  for (const Tensor* g : bucket.grads) {
    if (in_place(*g)) continue;
    const size_t n = static_cast<size_t>(g->numel());
    if (g->dtype() == DType::F32) {
      std::memcpy(f.staging.data() + at, g->data(), n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) f.staging[at + i] = load_as_f32(g->data(), g->dtype(), i);
    }
    at += n;
  }
  std::lock_guard<std::mutex> lock(mpi_mutex_);
  f.requests.clear();
  // MPI counts are int: one call per 2^30 elements at most.
  auto all_reduce = [&f](float* data, size_t n) {
    const size_t chunk = size_t{1} << 30;
    for (size_t off = 0; off < n; off += chunk) {
      f.requests.emplace_back();
      check(MPI_Iallreduce(MPI_IN_PLACE, data + off, static_cast<int>(std::min(chunk, n - off)), MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD, &f.requests.back()),
            "MPI_Iallreduce of a gradient bucket");
    }
  };
  for (Tensor* g : bucket.grads)
    if (in_place(*g)) all_reduce(g->data_as<float>(), static_cast<size_t>(g->numel()));
  all_reduce(f.staging.data(), packed);
  f.active = true;
  ++active_flights_;
  progress_wake_.notify_one();
}

void MpiCommunicator::test_flights() {
  for (Flight& f : flights_) {
    if (!f.active) continue;
    int done = 0;
    // An error is left for complete_buckets' wait to report (it tests the same requests).
    if (MPI_Testall(static_cast<int>(f.requests.size()), f.requests.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      continue;
    if (done) {
      f.active = false;
      --active_flights_;
    }
  }
}

// Sleeps while nothing travels; while buckets do, tests them every ~20 us (a test that finds
// nothing to do costs well under a microsecond; the sleep leaves the core to the compute).
void MpiCommunicator::progress_loop() {
  std::unique_lock<std::mutex> lock(mpi_mutex_);
  while (!progress_stop_) {
    if (active_flights_ == 0) {
      progress_wake_.wait(lock);
      continue;
    }
    test_flights();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
  }
}

void MpiCommunicator::set_progress_thread(bool on) {
  if (!on) {
    stop_progress_thread();
    return;
  }
  if (progress_thread_.joinable()) return;
  if (thread_level_ < MPI_THREAD_SERIALIZED)
    throw UsageError("--dist-progress-thread: this MPI does not provide MPI_THREAD_SERIALIZED");
  progress_stop_ = false;
  progress_thread_ = std::thread([this] { progress_loop(); });
}

void MpiCommunicator::stop_progress_thread() {
  if (!progress_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    progress_stop_ = true;
  }
  progress_wake_.notify_one();
  progress_thread_.join();
}

// Nudges every reduction in flight (OpenMPI moves a non-blocking collective only inside MPI calls).
void MpiCommunicator::progress() {
  std::lock_guard<std::mutex> lock(mpi_mutex_);
  test_flights();
}

// In bucket order: wait for bucket k, write it back (rounded once to the buffer's dtype)
// while the later buckets still travel.
void MpiCommunicator::complete_buckets(std::vector<Bucket>& buckets) {
  {
    std::lock_guard<std::mutex> lock(mpi_mutex_);
    for (size_t b = 0; b < buckets.size(); ++b)
      if (!flights_[b].active) ++buckets_done_in_backward_;  // as the last test saw them
  }
  if (world_size_ == 1) return;  // start_bucket moved nothing
  std::vector<MPI_Request> broadcasts;  // ordered and unsharded: the sums from their owners
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!buckets[b].started) throw Error("complete_buckets: bucket " + std::to_string(b) + " was never started");
    Flight& f = flights_[b];
    bool active;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex_);
      active = f.active;
    }
    if (active) {
      // Completed requests are MPI_REQUEST_NULL: testing them again (here or in the
      // progress thread) finds them done.
      const auto t0 = std::chrono::steady_clock::now();
      wait(f.requests.data(), static_cast<int>(f.requests.size()), "the gradient all-reduce");
      gradient_wait_seconds_ += seconds_since(t0);
      std::lock_guard<std::mutex> lock(mpi_mutex_);
      if (f.active) {
        f.active = false;
        --active_flights_;
      }
    }
    if (ordered()) {
      finish_ordered(buckets[b], f, broadcasts);
      continue;
    }
    size_t at = 0;
    for (Tensor* g : buckets[b].grads) {
      if (in_place(*g)) continue;  // already summed where it lies
      const size_t n = static_cast<size_t>(g->numel());
      if (g->dtype() == DType::F32) {
        std::memcpy(g->data(), f.staging.data() + at, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) store_from_f32(g->data(), g->dtype(), i, f.staging[at + i]);
      }
      at += n;
    }
  }
  if (!broadcasts.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    wait(broadcasts.data(), static_cast<int>(broadcasts.size()), "the broadcast of the gradient sums");
    gradient_wait_seconds_ += seconds_since(t0);
  }
}

void MpiCommunicator::agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) {
  for (const Tensor* t : {&found_inf, &nonfinite_loss, &norm}) {
    require_cpu(*t, "a guard scalar");
    if (t->dtype() != DType::F32 || t->numel() != 1) throw Error("agree_on_guard: needs one-element FP32 tensors");
  }
  float flags[2] = {*found_inf.data_as<float>(), *nonfinite_loss.data_as<float>()};
  all_reduce_host(flags, 2, MPI_FLOAT, MPI_MAX, "the agreement on found_inf");
  // A NaN norm must survive the sum: MPI_SUM on doubles propagates NaN and inf as + does.
  const double local = static_cast<double>(*norm.data_as<float>());
  double sum_sq = local * local;  // exact: a float's square fits in a double
  all_reduce_host(&sum_sq, 1, MPI_DOUBLE, MPI_SUM, "the agreement on the gradient norm");
  *found_inf.data_as<float>() = flags[0];
  *nonfinite_loss.data_as<float>() = flags[1];
  *norm.data_as<float>() = static_cast<float>(std::sqrt(sum_sq / world_size_));
  agreements_ += 2;
}

void MpiCommunicator::average_loss(Tensor& loss) {
  require_cpu(loss, "the loss");
  if (loss.dtype() != DType::F32 || loss.numel() != 1) throw Error("average_loss: needs a one-element FP32 tensor");
  // Gathered and added in rank order: the sum's order is belay's, not the MPI library's.
  const std::vector<double> all = all_gather_value(*loss.data_as<float>());
  float v = 0.0f;
  for (double x : all) v += static_cast<float>(x);  // each x is a float, exactly
  *loss.data_as<float>() = v / static_cast<float>(world_size_);
  ++agreements_;
}

int MpiCommunicator::max_over_ranks(int value) {
  all_reduce_host(&value, 1, MPI_INT, MPI_MAX, "the all-reduce of the stop flag");
  ++agreements_;
  return value;
}

bool MpiCommunicator::replicas_agree(uint64_t checksum) {
  uint64_t lo_hi[2] = {checksum, ~checksum};  // min of the value and of its complement: one call
  all_reduce_host(lo_hi, 2, MPI_UINT64_T, MPI_MIN, "the all-reduce of the replicas' checksum");
  ++agreements_;
  return lo_hi[0] == checksum && lo_hi[1] == ~checksum;
}

void MpiCommunicator::abort(int exit_code) {
  stop_progress_thread();  // it never blocks inside MPI: it returns within one test
  // MPI_Abort ends the process without running atexit handlers, where the coverage runtime
  // writes its profile: write it now, or the lines this rank ran before the abort go uncounted.
  if (__llvm_profile_write_file) __llvm_profile_write_file();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace belay
