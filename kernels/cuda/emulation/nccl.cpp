// NCCL as the emulated device answers it: the calls belay makes (amp/dist/nccl_communicator.cpp),
// compiled against the toolkit's own <nccl.h> and linked instead of libnccl, so the
// communicator CI runs is the one a GPU runs. Each rank is one process with its own emulated
// device; the ranks of a communicator meet in one POSIX shared-memory segment named by the
// unique id (so they must share a machine, as the emulated devices do).
//
// What it keeps of NCCL's semantics:
// - ncclAllReduce sums in the buffer's own dtype along a ring, rounding at every hop, as the
//   real ring's reduce-scatter + all-gather does. The order, for N ranks and a buffer cut
//   into N chunks: chunk c starts at rank c, and rank c+1, c+2, ... (mod N) each add their
//   own value to what arrives: ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c+N-1}, rounded to the
//   dtype after every +; the finished chunk then travels the ring unchanged (all-gather), so
//   every rank ends with the same bits. FP16/BF16 are added in FP32 and rounded: FP32 has
//   more than 2p+2 bits of the 11 (8) of FP16 (BF16), so that is the correctly rounded sum.
//   Buffers larger than N slots are done in slices of N slots, each a whole ring.
// - ncclReduceScatter (N blocks of recvcount elements; rank r receives block r's sum) is the
//   ring's first half in NCCL's order for it: block c starts at rank c+1 and ends on rank c,
//   ((x_{c+1} + x_{c+2}) + ...) + x_c, rounded to the dtype after every + (whatever the size:
//   each block runs in slices of one slot, each slice a ring of its own). In place when
//   recvbuff is sendbuff + rank * recvcount; sendbuff is left as it was either way (the ring
//   sums in a copy), its block r aside when in place.
// - ncclAllGather (rank r's sendcount elements become block r of every rank's recvbuff) is
//   the ring's second half: bytes forwarded, never summed. In place when sendbuff is
//   recvbuff + rank * sendcount.
// - Work is ordered on the stream given: the collective starts when the stream reaches it and
//   the stream's later work waits for its end (simt_internal.h's stall), while the host goes
//   on. The ring runs on a progress thread per communicator (NCCL's kernel on the GPU), so a
//   host that waits for the stream by polling an event (belay does, with its deadline) is
//   never blocked by a peer that is gone.
// - ncclCommInitRank(Config) with a non-blocking config returns ncclInProgress until every
//   rank has joined (ncclCommGetAsyncError says when); ncclCommAbort ends the ring and tells
//   the peers, whose communicators then report ncclRemoteError, as NCCL's do.
// Faults to test belay's handling of them (environment, read at init):
//   BELAY_EMU_NCCL_HANG_RANK=R  rank R never joins its communicator (an init that hangs);
//   BELAY_EMU_NCCL_FAIL=R:K     rank R's K-th collective (from 0; all-reduce, reduce-scatter,
//                               all-gather alike) fails asynchronously with ncclSystemError and
//                               never completes (a failed NCCL kernel).
#include <fcntl.h>
#include <nccl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/dtype.h"
#include "kernels/cuda/emulation/simt_internal.h"

namespace belay::emu {
namespace {

constexpr size_t kSlotBytes = size_t{64} << 10;  // one message of the ring, per rank (tests/dist/test_nccl_ring.cpp too)
constexpr int kMaxRanks = 64;
constexpr char kIdMagic[8] = "belayem";

// The segment: a header, then per rank the counters of its slot, then the slots' bytes.
// Rank r writes only its own slot; rank r+1 reads it. Lock-free atomics are address-free, so
// they work between processes.
struct alignas(64) Header {
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> aborted;  // a rank called ncclCommAbort
};
struct alignas(64) SlotCounters {
  std::atomic<uint64_t> posted;    // messages written into this slot
  std::atomic<uint64_t> consumed;  // messages the right neighbour has read
};
size_t segment_bytes(int nranks) { return sizeof(Header) + nranks * (sizeof(SlotCounters) + kSlotBytes); }

struct IdData {
  char magic[8];
  char name[64];
};
static_assert(sizeof(IdData) <= NCCL_UNIQUE_ID_BYTES);

enum class Kind { AllReduce, ReduceScatter, AllGather };

struct Job {
  Kind kind = Kind::AllReduce;
  char* buf;           // all-reduce: recvbuff; reduce-scatter: scratch; all-gather: recvbuff
  size_t count;        // all-reduce: the buffer's elements; the others: one rank's block
  DType dtype;
  char* out = nullptr;        // reduce-scatter: recvbuff (block `rank` of scratch goes there)
  std::vector<char> scratch;  // reduce-scatter: a copy of sendbuff, summed in place by the ring
  std::atomic<bool> done{false};
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

// The communicator's state, shared with the operations queued on streams (which may outlive
// the handle: ncclCommAbort while they wait).
struct CommState {
  int rank = 0, nranks = 1;
  std::string name;
  char* base = nullptr;
  std::atomic<int> status{ncclInProgress};  // ncclCommGetAsyncError's answer
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::shared_ptr<Job>> jobs;  // under mutex
  std::vector<std::shared_ptr<Job>> all;  // under mutex: every job not yet done (aborted: released)
  uint64_t sent = 0, received = 0;        // progress thread only
  int64_t ops = 0;                        // host: all-reduces enqueued
  int hang_rank = -1, fail_rank = -1;
  int64_t fail_op = -1;
  std::thread progress;

  Header* header() { return reinterpret_cast<Header*>(base); }
  SlotCounters* counters(int r) { return reinterpret_cast<SlotCounters*>(base + sizeof(Header)) + r; }
  char* slot(int r) { return base + sizeof(Header) + nranks * sizeof(SlotCounters) + r * kSlotBytes; }

  // Waits (spinning, then sleeping) until `ready()`; false when the ring must give up.
  template <class F>
  bool wait_for(F ready) {
    for (int polls = 0;; ++polls) {
      if (ready()) return true;
      const int st = status.load();
      if (stop.load() || (st != ncclSuccess && st != ncclInProgress)) return false;
      if (header()->aborted.load()) {
        status = ncclRemoteError;  // a peer aborted: this ring can never finish
        return false;
      }
      if (polls < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  bool send(const char* data, size_t bytes) {
    SlotCounters* mine = counters(rank);
    if (!wait_for([&] { return mine->consumed.load(std::memory_order_acquire) == sent; })) return false;
    std::memcpy(slot(rank), data, bytes);
    mine->posted.store(++sent, std::memory_order_release);
    return true;
  }
  // Hands the left neighbour's next message to `use`, then frees its slot.
  template <class F>
  bool receive(F use) {
    const int left = (rank + nranks - 1) % nranks;
    SlotCounters* theirs = counters(left);
    if (!wait_for([&] { return theirs->posted.load(std::memory_order_acquire) > received; })) return false;
    use(slot(left));
    theirs->consumed.store(++received, std::memory_order_release);
    return true;
  }
  bool ring(Job& job);
  bool ring_slice(Job& job, size_t first, size_t len);
  bool blocks(Job& job);
  void run();
};

namespace {
size_t chunk_begin(size_t len, int n, int c) { return len * static_cast<size_t>(c) / static_cast<size_t>(n); }
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

// One slice of at most nranks * kSlotBytes bytes: reduce-scatter, then all-gather.
bool CommState::ring_slice(Job& job, size_t first, size_t len) {
  const size_t es = dtype_size(job.dtype);
  const int n = nranks;
  char* data = job.buf + first * es;
  auto chunk = [&](int c, size_t* at, size_t* count) {
    *at = chunk_begin(len, n, c);
    *count = chunk_begin(len, n, c + 1) - *at;
  };
  size_t at = 0, count = 0;
  // Reduce-scatter: at step s, rank r sends chunk r-s and adds its own values to chunk
  // r-1-s as it arrives (arriving partial sum + own value, rounded to the dtype).
  for (int s = 0; s < n - 1; ++s) {
    chunk(mod(rank - s, n), &at, &count);
    if (!send(data + at * es, count * es)) return false;
    chunk(mod(rank - 1 - s, n), &at, &count);
    const bool ok = receive([&](const char* in) {
      for (size_t i = 0; i < count; ++i) {
        const float sum = load_as_f32(in, job.dtype, i) + load_as_f32(data, job.dtype, at + i);
        store_from_f32(data, job.dtype, at + i, sum);
      }
    });
    if (!ok) return false;
  }
  // All-gather: rank r holds the finished chunk r+1 and passes each finished chunk on.
  for (int s = 0; s < n - 1; ++s) {
    chunk(mod(rank + 1 - s, n), &at, &count);
    if (!send(data + at * es, count * es)) return false;
    chunk(mod(rank - s, n), &at, &count);
    if (!receive([&](const char* in) { std::memcpy(data + at * es, in, count * es); })) return false;
  }
  return true;
}

// Reduce-scatter and all-gather: block c is [c * count, (c + 1) * count) of job.buf, done
// in slices of at most one slot per block. Reduce-scatter: at step s, rank r sends block
// r-1-s and adds its own values to block r-2-s as it arrives, so block c starts at rank c+1
// and its last + is on rank c (NCCL's ring for ncclReduceScatter). All-gather: rank r holds
// block r; at step s it sends block r-s and receives block r-1-s.
bool CommState::blocks(Job& job) {
  const size_t es = dtype_size(job.dtype);
  const int n = nranks;
  const size_t slot_elems = kSlotBytes / es;
  for (size_t off = 0; off < job.count; off += slot_elems) {
    const size_t len = std::min(slot_elems, job.count - off);
    auto at = [&](int c) { return (static_cast<size_t>(mod(c, n)) * job.count + off) * es; };
    for (int s = 0; s < n - 1; ++s) {
      if (job.kind == Kind::ReduceScatter) {
        if (!send(job.buf + at(rank - 1 - s), len * es)) return false;
        char* data = job.buf + at(rank - 2 - s);
        const bool ok = receive([&](const char* in) {
          for (size_t i = 0; i < len; ++i) {
            const float sum = load_as_f32(in, job.dtype, i) + load_as_f32(data, job.dtype, i);
            store_from_f32(data, job.dtype, i, sum);
          }
        });
        if (!ok) return false;
      } else {
        if (!send(job.buf + at(rank - s), len * es)) return false;
        char* data = job.buf + at(rank - 1 - s);
        if (!receive([&](const char* in) { std::memcpy(data, in, len * es); })) return false;
      }
    }
  }
  if (job.kind == Kind::ReduceScatter)
    std::memmove(job.out, job.buf + static_cast<size_t>(rank) * job.count * es, job.count * es);
  return true;
}

bool CommState::ring(Job& job) {
  if (job.kind != Kind::AllReduce) return blocks(job);
  if (nranks == 1) return true;
  const size_t slice = static_cast<size_t>(nranks) * (kSlotBytes / dtype_size(job.dtype));
  for (size_t first = 0; first < job.count; first += slice)
    if (!ring_slice(job, first, std::min(slice, job.count - first))) return false;
  return true;
}

// The progress thread: joins the communicator, then runs each posted collective in order.
void CommState::run() {
  if (rank != hang_rank) header()->joined.fetch_add(1);
  const bool joined = wait_for([&] {
    return rank != hang_rank && header()->joined.load() == static_cast<uint32_t>(nranks);
  });
  // Not joined: stopped, or a peer aborted (wait_for set ncclRemoteError).
  int expected = ncclInProgress;
  if (joined) {
    // Every rank has mapped the segment: its name is no longer needed, and a rank that is
    // killed later leaves nothing behind in /dev/shm.
    shm_unlink(name.c_str());
    status.compare_exchange_strong(expected, ncclSuccess);
  }
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [&] { return stop.load() || !jobs.empty(); });
      if (stop.load()) return;
      job = jobs.front();
      jobs.pop_front();
    }
    // A collective on a communicator in error never completes (NCCL's kernel would spin).
    if (status.load() == ncclSuccess && ring(*job)) job->done = true;
  }
}

namespace {

thread_local int t_group_depth = 0;
thread_local std::vector<std::function<void()>> t_group;  // enqueues deferred to ncclGroupEnd

std::shared_ptr<CommState> join(int nranks, const ncclUniqueId& id, int rank, ncclResult_t* rc) {
  IdData data;
  std::memcpy(&data, id.internal, sizeof data);
  if (std::memcmp(data.magic, kIdMagic, sizeof kIdMagic) != 0 || nranks < 1 || nranks > kMaxRanks || rank < 0 ||
      rank >= nranks) {
    *rc = ncclInvalidArgument;
    return nullptr;
  }
  auto s = std::make_shared<CommState>();
  s->rank = rank;
  s->nranks = nranks;
  s->name = data.name;
  const int fd = shm_open(s->name.c_str(), O_CREAT | O_RDWR, 0600);
  const size_t bytes = segment_bytes(nranks);
  // Every rank sizes it alike (a new segment reads as zeros: the counters start at 0).
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    *rc = ncclSystemError;
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *rc = ncclSystemError;
    return nullptr;
  }
  s->base = static_cast<char*>(p);
  s->hang_rank = env_int("BELAY_EMU_NCCL_HANG_RANK", -1);
  if (const char* f = std::getenv("BELAY_EMU_NCCL_FAIL"); f && std::strchr(f, ':')) {
    s->fail_rank = std::atoi(f);
    s->fail_op = std::atoll(std::strchr(f, ':') + 1);
  }
  s->progress = std::thread([raw = s.get()] { raw->run(); });
  *rc = ncclSuccess;
  return s;
}

// Ends the progress thread and releases the collectives still waiting (ncclCommAbort ends
// NCCL's kernels too, so nothing stays queued on a stream forever).
void shut_down(CommState& s, bool abort) {
  if (abort) s.header()->aborted.store(1);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
    for (auto& j : s.all) j->done = true;
    s.all.clear();
  }
  s.wake.notify_all();
  if (s.progress.joinable()) s.progress.join();
  munmap(s.base, segment_bytes(s.nranks));
  shm_unlink(s.name.c_str());  // the name only: a peer keeps its mapping
}

}  // namespace
}  // namespace belay::emu

// nccl.h's opaque handle.
struct ncclComm {
  std::shared_ptr<belay::emu::CommState> s;
};

using belay::emu::CommState;
using belay::emu::Job;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  belay::emu::IdData data{};
  std::memcpy(data.magic, belay::emu::kIdMagic, sizeof data.magic);
  std::random_device rd;
  std::snprintf(data.name, sizeof data.name, "/belay-emu-nccl-%d-%08x%08x", static_cast<int>(getpid()), rd(), rd());
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &data, sizeof data);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (!comm) return ncclInvalidArgument;
  ncclResult_t rc = ncclSuccess;
  auto s = belay::emu::join(nranks, id, rank, &rc);
  if (!s) return rc;
  *comm = new ncclComm{s};
  if (config && config->blocking == 0) return ncclInProgress;
  while (s->status.load() == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return static_cast<ncclResult_t>(s->status.load());
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = static_cast<ncclResult_t>(comm->s->status.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->s->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->s->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  belay::emu::shut_down(*comm->s, /*abort=*/true);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  belay::emu::shut_down(*comm->s, /*abort=*/false);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++belay::emu::t_group_depth;
  return ncclSuccess;
}

// The collectives of a group are launched together at its end, in the order they were called.
ncclResult_t ncclGroupEnd() {
  if (belay::emu::t_group_depth == 0) return ncclInvalidUsage;
  if (--belay::emu::t_group_depth > 0) return ncclSuccess;
  auto pending = std::move(belay::emu::t_group);
  belay::emu::t_group.clear();
  for (auto& launch : pending) launch();
  return ncclSuccess;
}

}  // extern "C"

namespace {

// Every collective: checked, then queued on the stream (its input copied when the stream
// reaches it, then handed to the progress thread; the stream's later work waits for its end).
ncclResult_t enqueue(belay::emu::Kind kind, const void* sendbuff, void* recvbuff, size_t count,
                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  using belay::emu::Kind;
  if (!comm || !recvbuff || (!sendbuff && count > 0)) return ncclInvalidArgument;
  belay::DType dtype;
  switch (datatype) {
    case ncclFloat32: dtype = belay::DType::F32; break;
    case ncclFloat16: dtype = belay::DType::F16; break;
    case ncclBfloat16: dtype = belay::DType::BF16; break;
    default: return ncclInvalidArgument;
  }
  std::shared_ptr<CommState> s = comm->s;
  const int status = s->status.load();
  if (status != ncclSuccess && status != ncclInProgress) return static_cast<ncclResult_t>(status);
  auto job = std::make_shared<Job>();
  job->kind = kind;
  job->buf = static_cast<char*>(recvbuff);
  job->count = count;
  job->dtype = dtype;
  const int64_t index = s->ops++;
  const bool fail = s->rank == s->fail_rank && index == s->fail_op;
  const size_t bytes = count * belay::dtype_size(dtype);  // one rank's block (reduce-scatter, all-gather)
  auto launch = [s, job, sendbuff, recvbuff, bytes, fail, stream] {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      std::erase_if(s->all, [](const std::shared_ptr<Job>& j) { return j->done.load(); });
      s->all.push_back(job);
    }
    belay::emu::enqueue_on_stream(stream, [s, job, sendbuff, recvbuff, bytes, fail] {
      const char* in = static_cast<const char*>(sendbuff);
      char* out = static_cast<char*>(recvbuff);
      switch (job->kind) {
        case Kind::AllReduce:
          if (in != out) std::memmove(out, in, bytes);
          break;
        case Kind::ReduceScatter:  // the ring sums a copy: sendbuff's other blocks stay as they were
          job->scratch.assign(in, in + bytes * static_cast<size_t>(s->nranks));
          job->buf = job->scratch.data();
          job->out = out;
          break;
        case Kind::AllGather: {
          char* mine = out + bytes * static_cast<size_t>(s->rank);
          if (in != mine) std::memmove(mine, in, bytes);
          break;
        }
      }
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->stop.load()) return;
      if (fail) {
        int expected = ncclSuccess;
        s->status.compare_exchange_strong(expected, ncclSystemError);
      }
      s->jobs.push_back(job);
      s->wake.notify_one();
    });
    belay::emu::enqueue_stall_on_stream(stream, [job] { return job->done.load(); });
  };
  if (belay::emu::t_group_depth > 0)
    belay::emu::t_group.push_back(launch);
  else
    launch();
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum) return ncclInvalidArgument;  // belay sums; the others are not emulated
  return enqueue(belay::emu::Kind::AllReduce, sendbuff, recvbuff, count, datatype, comm, stream);
}

// recvcount elements per rank: sendbuff holds nranks * recvcount.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum) return ncclInvalidArgument;
  return enqueue(belay::emu::Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, comm, stream);
}

// sendcount elements per rank: recvbuff holds nranks * sendcount.
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(belay::emu::Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "";
}

}  // extern "C"
