// Data parallelism between CPU processes over MPI (OpenMPI from Debian), one process per
// rank, started by mpirun: rank and world size come from the launcher. Built only when
// CMake finds MPI (BELAY_HAVE_MPI).
//
// Gradients travel in buckets (amp/dist/bucketed_communicator.h), reduced with non-blocking
// MPI_Iallreduce started from backward's hook: a large FP32 gradient in place, the rest of a
// bucket (small or FP16/BF16 buffers) packed into one FP32 buffer.
// OpenMPI has no progress thread by default: a started reduction moves when this process
// calls into MPI, so the hook (after each parameter's gradient) and the start of each
// further bucket test the requests in flight, and finish unpacks bucket k while bucket k+1
// still travels.
//
// With set_progress_thread(true) (`--dist-progress-thread`) a thread also tests the
// reductions in flight every few tens of microseconds while backward computes, so they move
// between the hook's calls too. MPI is initialised MPI_THREAD_SERIALIZED and every MPI call
// of this class holds one mutex: never two threads in MPI at once.
//
// A reduction of defined order (amp/dist/mpi_ordered.cpp): with more than two ranks, or a
// sharded optimizer, each gradient is summed on one rank (its owner) in rank order 0..N-1
// from point-to-point messages, not by MPI_Iallreduce, whose order is the library's (with
// two ranks a + b = b + a, so the all-reduce already has it). Unsharded, the owner then
// broadcasts the sum; sharded, it keeps it and broadcasts the updated parameter after the step.
//
// Every collective, the belts' small ones included, is non-blocking and then polled with a
// deadline (`--dist-timeout`): a peer that died or hangs turns into an error on this rank
// (the CLI then ends every rank with MPI_Abort) instead of a wait without end.
#pragma once
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "amp/dist/bucketed_communicator.h"

namespace belay {

class MpiCommunicator : public BucketedCommunicator {
 public:
  MpiCommunicator();   // MPI_Init unless already initialised
  ~MpiCommunicator() override;  // MPI_Finalize if this object initialised MPI
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int world_size() const override { return world_size_; }
  int rank() const override { return rank_; }
  std::string name() const override { return "mpi"; }
  void agree_on_guard(Tensor& found_inf, Tensor& nonfinite_loss, Tensor& norm) override;
  void average_loss(Tensor& loss) override;
  int max_over_ranks(int value) override;
  bool replicas_agree(uint64_t checksum) override;
  void abort(int exit_code) override;
  void set_progress_thread(bool on) override;
  void all_gather_params(const std::vector<Var>& params) override;
  void gather_to_root(Tensor& t, int owner) override;
  std::vector<double> all_gather_value(double value) override;

 protected:
  void start_bucket(size_t index, Bucket& bucket) override;
  void complete_buckets(std::vector<Bucket>& buckets) override;
  void progress() override;
  size_t wire_bytes(const Tensor&) const override { return sizeof(float); }

  // Polls the requests until all complete; past the timeout, throws an Error naming `what`.
  void wait(MPI_Request* requests, int count, const char* what);
  // A small blocking all-reduce on host memory, as Iallreduce + wait (so it has the deadline).
  void all_reduce_host(void* buffer, int count, MPI_Datatype type, MPI_Op op, const char* what);
  // Throws the timeout error when `since` is longer ago than the timeout.
  void check_deadline(std::chrono::steady_clock::time_point since, const char* what) const;
  void sum_over_ranks(double* values, int count) override;
  void max_flags_over_ranks(float* values, int count) override;
  std::mutex mpi_mutex_;  // held around every MPI call (MPI_THREAD_SERIALIZED)

 private:
  struct Flight {  // one bucket on its way
    std::vector<float> staging;          // the bucket's gradients as FP32, reduced in place
    std::vector<float> recv;             // ordered: the peers' copies of the gradients this rank sums
    std::vector<float> widened;          // ordered: the FP16/BF16 gradients as FP32
    std::vector<MPI_Request> requests;   // one per 2^30 elements (MPI counts are int)
    bool active = false;                 // started and not yet done (under mpi_mutex_)
  };
  // The reduction of defined order (mpi_ordered.cpp): whether it is used, its start (sends
  // and receives posted), and its end (the ordered sums; unsharded, the broadcasts started).
  bool ordered() const { return sharded() || world_size_ > 2; }
  void start_ordered(size_t index, Bucket& bucket, Flight& f);
  void finish_ordered(Bucket& bucket, Flight& f, std::vector<MPI_Request>& broadcasts);
  void test_flights();   // under mpi_mutex_: tests every active flight once
  void progress_loop();  // the progress thread
  void stop_progress_thread();

  int rank_ = 0;
  int world_size_ = 1;
  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::vector<Flight> flights_;  // per bucket; kept so a steady step allocates nothing
  std::vector<float> ordered_sum_;  // finish_ordered's sum of one gradient
  int active_flights_ = 0;       // under mpi_mutex_
  std::thread progress_thread_;
  std::condition_variable progress_wake_;
  bool progress_stop_ = false;   // under mpi_mutex_
};

}  // namespace belay
