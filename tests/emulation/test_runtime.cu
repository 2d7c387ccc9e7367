// Tests of the emulated CUDA runtime's streams, events and last error
// (kernels/cuda/emulation/runtime.cpp), with small kernels compiled as test_simt.cu's are.
// The device's schedule is drawn from the seed: a case that shows a schedule the seed can
// produce (two streams interleaved both ways, a read that comes too early) runs the same
// calls under several seeds (reseed_stream_order, as BELAY_EMU_SEED would) and asks that
// some seed shows it; a case about an order CUDA guarantees asks it of every seed. A fault is
// sticky for the process: the one case that faults is alone in its process under CTest.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/emulation/simt.h"
#include "kernels/cuda/simt_seam.cuh"
#include "tests/emulation/emu_test_util.h"

namespace {

using belay::cuda::launch;
using namespace belay::emu_test;

constexpr uint64_t kSeeds = 16;  // seeds tried where some seed must show a schedule

// Appends `tag` to a log in memory the host can read: log[0] counts the entries.
__global__ void append_kernel(int* log, int tag) {
  log[1 + log[0]] = tag;
  log[0] += 1;
}
__global__ void store_kernel(int* p, int value) { *p = value; }
__global__ void copy_kernel(const int* src, int* dst) { *dst = *src; }
// A float4 load 4 bytes off its alignment: faults with cudaErrorMisalignedAddress.
__global__ void misaligned_kernel(const float* in, float* out) {
  const float4 v = belay::cuda::load_vector(reinterpret_cast<const float4*>(in + 1));
  out[0] = v.x;
}

int* pinned_ints(size_t n) {
  void* p = nullptr;
  REQUIRE_CUDA(cudaMallocHost(&p, n * sizeof(int)));
  std::memset(p, 0, n * sizeof(int));
  return static_cast<int*>(p);
}

cudaStream_t new_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&s, flags));
  return s;
}

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  REQUIRE_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// The tags of a pinned log, in the order the device ran the appends.
std::vector<int> tags(const int* log) { return std::vector<int>(log + 1, log + 1 + log[0]); }

// Two streams each append kOps tags (stream a: 100 + i, stream b: 200 + i), the host enqueueing
// them alternately; returns the order the device ran them in, as a string of 'a' and 'b'.
std::string two_stream_order(uint64_t seed) {
  constexpr int kOps = 6;
  REQUIRE_CUDA(cudaDeviceSynchronize());  // start from an idle device
  belay::emu::reseed_stream_order(seed);
  cudaStream_t a = new_stream(cudaStreamNonBlocking), b = new_stream(cudaStreamNonBlocking);
  int* log = pinned_ints(1 + 2 * kOps);
  for (int i = 0; i < kOps; ++i) {
    launch<append_kernel>(dim3(1), dim3(1), 0, a, log, 100 + i);
    launch<append_kernel>(dim3(1), dim3(1), 0, b, log, 200 + i);
  }
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  std::string order;
  int next[2] = {100, 200};
  for (int t : tags(log)) {
    const int which = t / 100 - 1;
    CHECK(t == next[which]++);  // each stream in its own order
    order += static_cast<char>('a' + which);
  }
  CHECK(order.size() == 2 * kOps);
  REQUIRE_CUDA(cudaStreamDestroy(a));
  REQUIRE_CUDA(cudaStreamDestroy(b));
  REQUIRE_CUDA(cudaFreeHost(log));
  return order;
}

}  // namespace

// ---- Streams and events -----------------------------------------------------------------------

TEST_CASE("two streams' work interleaves in an order drawn from the seed, each stream in order", "[emu][stream]") {
  std::set<std::string> orders;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) orders.insert(two_stream_order(seed));
  INFO("orders seen: " << orders.size());
  CHECK(orders.size() >= 2);
  CHECK(two_stream_order(5) == two_stream_order(5));  // a seed replays its schedule
}

// The producer stores 1 on stream p, the consumer copies it on stream c. Returns what the
// consumer read: 1 if it ran after the producer, 0 if before.
int consumer_reads(uint64_t seed, bool wait_for_event) {
  REQUIRE_CUDA(cudaDeviceSynchronize());
  belay::emu::reseed_stream_order(seed);
  cudaStream_t p = new_stream(cudaStreamNonBlocking), c = new_stream(cudaStreamNonBlocking);
  cudaEvent_t produced = new_event();
  int* x = pinned_ints(2);
  launch<store_kernel>(dim3(1), dim3(1), 0, p, x, 1);
  REQUIRE_CUDA(cudaEventRecord(produced, p));
  if (wait_for_event) REQUIRE_CUDA(cudaStreamWaitEvent(c, produced, 0));
  launch<copy_kernel>(dim3(1), dim3(1), 0, c, x, x + 1);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const int read = x[1];
  REQUIRE_CUDA(cudaEventDestroy(produced));
  REQUIRE_CUDA(cudaStreamDestroy(p));
  REQUIRE_CUDA(cudaStreamDestroy(c));
  REQUIRE_CUDA(cudaFreeHost(x));
  return read;
}

TEST_CASE("an event waited for on another stream orders the two, without the wait some seed reads early",
          "[emu][stream]") {
  int early = 0, late = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    CHECK(consumer_reads(seed, true) == 1);
    (consumer_reads(seed, false) == 1 ? late : early) += 1;
  }
  CHECK(early > 0);  // the missing wait is caught
  CHECK(late > 0);   // and the streams do run both ways
}

// A, then B on stream 0, then C, A and C on stream s; returns the order of the three.
std::vector<int> around_legacy(uint64_t seed, unsigned flags) {
  REQUIRE_CUDA(cudaDeviceSynchronize());
  belay::emu::reseed_stream_order(seed);
  cudaStream_t s = new_stream(flags);
  int* log = pinned_ints(4);
  launch<append_kernel>(dim3(1), dim3(1), 0, s, log, 1);
  launch<append_kernel>(dim3(1), dim3(1), 0, nullptr, log, 2);
  launch<append_kernel>(dim3(1), dim3(1), 0, s, log, 3);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const std::vector<int> order = tags(log);
  REQUIRE_CUDA(cudaStreamDestroy(s));
  REQUIRE_CUDA(cudaFreeHost(log));
  return order;
}

TEST_CASE("the legacy default stream waits for blocking streams and they for it, not so a non-blocking one",
          "[emu][stream]") {
  const std::vector<int> in_order{1, 2, 3};
  bool nonblocking_reordered = false;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    CHECK(around_legacy(seed, cudaStreamDefault) == in_order);
    const std::vector<int> order = around_legacy(seed, cudaStreamNonBlocking);
    CHECK(order.size() == 3);
    if (order != in_order) nonblocking_reordered = true;
  }
  CHECK(nonblocking_reordered);
}

TEST_CASE("stream and event synchronisation wait for their own work only, queries answer NotReady before",
          "[emu][stream]") {
  bool other_left_pending = false;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    REQUIRE_CUDA(cudaDeviceSynchronize());
    belay::emu::reseed_stream_order(seed);
    cudaStream_t s1 = new_stream(cudaStreamNonBlocking), s2 = new_stream(cudaStreamNonBlocking);
    cudaEvent_t e1 = new_event(), e2 = new_event();
    int* flags = pinned_ints(4);
    launch<store_kernel>(dim3(1), dim3(1), 0, s1, flags, 1);
    REQUIRE_CUDA(cudaEventRecord(e1, s1));
    launch<store_kernel>(dim3(1), dim3(1), 0, s1, flags + 1, 1);
    for (int i = 0; i < 3; ++i) launch<store_kernel>(dim3(1), dim3(1), 0, s2, flags + 2, 1 + i);
    REQUIRE_CUDA(cudaEventRecord(e2, s2));
    REQUIRE_CUDA(cudaEventSynchronize(e1));
    CHECK(flags[0] == 1);  // what e1 captured has run
    CHECK(cudaEventQuery(e1) == cudaSuccess);
    REQUIRE_CUDA(cudaStreamSynchronize(s1));
    CHECK(flags[1] == 1);
    CHECK(cudaStreamQuery(s1) == cudaSuccess);
    if (flags[2] != 3) {  // s2's last store has not run yet: its event cannot be complete
      other_left_pending = true;
      CHECK(cudaEventQuery(e2) == cudaErrorNotReady);
    }
    CHECK(cudaPeekAtLastError() == cudaSuccess);  // NotReady is not an error
    REQUIRE_CUDA(cudaDeviceSynchronize());
    CHECK(flags[2] == 3);
    CHECK(cudaStreamQuery(s2) == cudaSuccess);
    CHECK(cudaEventQuery(e2) == cudaSuccess);
    for (cudaEvent_t e : {e1, e2}) REQUIRE_CUDA(cudaEventDestroy(e));
    for (cudaStream_t s : {s1, s2}) REQUIRE_CUDA(cudaStreamDestroy(s));
    REQUIRE_CUDA(cudaFreeHost(flags));
  }
  CHECK(other_left_pending);
}

TEST_CASE("a host read before the wait can see stale data, a synchronous copy waits for stream 0 only",
          "[emu][stream]") {
  bool stale_pinned = false, stale_copy = false;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    REQUIRE_CUDA(cudaDeviceSynchronize());
    belay::emu::reseed_stream_order(seed);
    int* pinned = pinned_ints(1);
    int* dev = device_alloc<int>(2);
    REQUIRE_CUDA(cudaMemset(dev, 0, 2 * sizeof(int)));
    REQUIRE_CUDA(cudaDeviceSynchronize());  // (a memset is asynchronous)
    // A kernel's result read through mapped pinned memory before any wait.
    launch<store_kernel>(dim3(1), dim3(1), 0, nullptr, pinned, 7);
    if (*pinned == 0) stale_pinned = true;
    // cudaMemcpy to the host waits for stream 0 and the blocking streams, not a non-blocking one.
    cudaStream_t blocking = new_stream(cudaStreamDefault), nonblocking = new_stream(cudaStreamNonBlocking);
    launch<store_kernel>(dim3(1), dim3(1), 0, blocking, dev, 5);
    launch<store_kernel>(dim3(1), dim3(1), 0, nonblocking, dev + 1, 6);
    int host[2] = {-1, -1};
    REQUIRE_CUDA(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
    CHECK(host[0] == 5);
    CHECK(*pinned == 7);  // stream 0's earlier work has run too
    if (host[1] == 0) stale_copy = true;
    REQUIRE_CUDA(cudaDeviceSynchronize());
    for (cudaStream_t s : {blocking, nonblocking}) REQUIRE_CUDA(cudaStreamDestroy(s));
    REQUIRE_CUDA(cudaFree(dev));
    REQUIRE_CUDA(cudaFreeHost(pinned));
  }
  CHECK(stale_pinned);
  CHECK(stale_copy);
}

TEST_CASE("a stream destroyed with work queued still runs it, stream handles that are not streams are refused",
          "[emu][stream]") {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  int* x = pinned_ints(1);
  for (int i = 1; i <= 4; ++i) launch<store_kernel>(dim3(1), dim3(1), 0, s, x, i);
  REQUIRE_CUDA(cudaStreamDestroy(s));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  CHECK(*x == 4);
  // The destroyed handle, stream 0 itself and cudaStreamPerThread (which belay does not use).
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(nullptr) == cudaErrorInvalidResourceHandle);
  launch<store_kernel>(dim3(1), dim3(1), 0, s, x, 9);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaMemcpyAsync(x, x, sizeof(int), cudaMemcpyDefault, cudaStreamPerThread) == cudaErrorNotSupported);
  launch<store_kernel>(dim3(1), dim3(1), 0, cudaStreamPerThread, x, 9);
  CHECK(cudaGetLastError() == cudaErrorNotSupported);
  REQUIRE_CUDA(cudaStreamSynchronize(cudaStreamLegacy));  // the legacy stream by its other name
  CHECK(*x == 4);  // nothing refused ran
  REQUIRE_CUDA(cudaFreeHost(x));
}

// ---- The last error ---------------------------------------------------------------------------
// What the real runtime does (runtime.cpp cites the documentation for each): a failing call
// sets the calling thread's last error, a successful one leaves it, cudaGetLastError returns
// and clears it, cudaPeekAtLastError only returns it, cudaErrorNotReady is not recorded.

TEST_CASE("the last error: set by a failure, kept by successes, read by Peek, cleared by Get", "[emu][error]") {
  REQUIRE_CUDA(cudaGetLastError());
  CHECK(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);  // Peek does not clear
  int* d = device_alloc<int>(4);                           // a success does not clear either
  REQUIRE_CUDA(cudaMemset(d, 0, 4 * sizeof(int)));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
  CHECK(cudaSetDevice(3) == cudaErrorInvalidDevice);  // the latest failure replaces it
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // Get clears
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  // Each host thread has its own.
  CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  cudaError_t seen_there = cudaErrorUnknown, left_there = cudaErrorUnknown;
  std::thread([&] {
    seen_there = cudaPeekAtLastError();
    (void)cudaMalloc(nullptr, 1);
    left_there = cudaPeekAtLastError();
  }).join();
  CHECK(seen_there == cudaSuccess);
  CHECK(left_there == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  REQUIRE_CUDA(cudaFree(d));
}

TEST_CASE("cudaErrorNotReady from cudaEventQuery and cudaStreamQuery neither sets nor clears the last error",
          "[emu][error]") {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  cudaEvent_t e = new_event();
  int* x = pinned_ints(1);
  int not_ready_seen = 0;
  for (int round = 0; round < 64 && not_ready_seen < 4; ++round) {
    const bool with_error = round % 2 == 1;  // a failure left pending, or none
    REQUIRE_CUDA(cudaGetLastError());
    if (with_error) CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
    const cudaError_t expected = with_error ? cudaErrorInvalidDevice : cudaSuccess;
    for (int i = 0; i < 8; ++i) launch<store_kernel>(dim3(1), dim3(1), 0, s, x, i);
    REQUIRE_CUDA(cudaEventRecord(e, s));
    const cudaError_t event_state = cudaEventQuery(e), stream_state = cudaStreamQuery(s);
    CHECK((event_state == cudaSuccess || event_state == cudaErrorNotReady));
    CHECK((stream_state == cudaSuccess || stream_state == cudaErrorNotReady));
    if (event_state == cudaErrorNotReady || stream_state == cudaErrorNotReady) ++not_ready_seen;
    CHECK(cudaPeekAtLastError() == expected);
    CHECK(cudaGetLastError() == expected);
    REQUIRE_CUDA(cudaStreamSynchronize(s));
  }
  CHECK(not_ready_seen >= 4);
  REQUIRE_CUDA(cudaEventDestroy(e));
  REQUIRE_CUDA(cudaStreamDestroy(s));
  REQUIRE_CUDA(cudaFreeHost(x));
}

// (Faults: its own process.) A fault on one stream loses the whole context: work queued on
// other streams never runs, every later call on any stream returns the fault, and the last
// error is the fault in every thread, where cudaGetLastError cannot clear it.
TEST_CASE("a kernel fault on one stream is sticky for every stream and thread", "[emu][error][fault]") {
  cudaStream_t s1 = new_stream(cudaStreamNonBlocking), s2 = new_stream(cudaStreamNonBlocking);
  cudaEvent_t faulted = new_event();
  float* in = device_alloc<float>(8);
  float* out = device_alloc<float>(1);
  int* x = pinned_ints(1);
  launch<misaligned_kernel>(dim3(1), dim3(1), 0, s1, in, out);
  // The device may run the kernel at any moment from here: each call before the wait below
  // succeeds, or returns the fault if it has happened already.
  const cudaError_t recorded = cudaEventRecord(faulted, s1);
  const cudaError_t waited = cudaStreamWaitEvent(s2, faulted, 0);
  launch<store_kernel>(dim3(1), dim3(1), 0, s2, x, 1);  // behind the fault: never runs
  for (cudaError_t e : {recorded, waited, cudaPeekAtLastError()})
    CHECK((e == cudaSuccess || e == cudaErrorMisalignedAddress));
  CHECK(cudaStreamSynchronize(s2) == cudaErrorMisalignedAddress);
  CHECK(*x == 0);
  CHECK(cudaStreamQuery(s1) == cudaErrorMisalignedAddress);
  CHECK(cudaEventQuery(faulted) == cudaErrorMisalignedAddress);
  CHECK(cudaMemcpyAsync(out, in, 4, cudaMemcpyDeviceToDevice, s2) == cudaErrorMisalignedAddress);
  launch<store_kernel>(dim3(1), dim3(1), 0, s2, x, 2);
  CHECK(cudaGetLastError() == cudaErrorMisalignedAddress);
  CHECK(cudaGetLastError() == cudaErrorMisalignedAddress);  // not cleared
  CHECK(cudaPeekAtLastError() == cudaErrorMisalignedAddress);
  cudaError_t there = cudaSuccess;
  std::thread([&] { there = cudaGetLastError(); }).join();
  CHECK(there == cudaErrorMisalignedAddress);
  CHECK(cudaDeviceSynchronize() == cudaErrorMisalignedAddress);
  CHECK(*x == 0);
}

namespace {

// The identifiers in `source` that name a CUDA result code: cudaSuccess or cudaError followed by
// letters only (a hand scan: <regex> doubled this file's compile under the sanitizers).
std::vector<std::string> cuda_code_names(const std::string& source) {
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::vector<std::string> names;
  for (size_t i = 0; i < source.size();) {
    if (!is_word(source[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < source.size() && is_word(source[end])) ++end;
    const std::string word = source.substr(i, end - i);
    const std::string error_prefix = "cudaError";
    const std::string tail = word.rfind(error_prefix, 0) == 0 ? word.substr(error_prefix.size()) : "";
    const bool letters = !tail.empty() && std::all_of(tail.begin(), tail.end(), [](char c) {
      return std::isalpha(static_cast<unsigned char>(c));
    });
    if (word == "cudaSuccess" || letters) names.push_back(word);
    i = end;
  }
  return names;
}

}  // namespace

// Every cudaError* the emulator's sources name has the real runtime's name and a string; an
// unknown code is "unrecognized error code", as the runtime says.
TEST_CASE("cudaGetErrorName and cudaGetErrorString know every code the emulator returns", "[emu][error]") {
  std::map<std::string, cudaError_t> named;
  for (int code = 0; code < 1100; ++code) {
    const auto e = static_cast<cudaError_t>(code);
    const std::string name = cudaGetErrorName(e);
    if (name != "unrecognized error code") named[name] = e;
  }
  std::set<std::string> used;
  for (const char* file : {"runtime.cpp", "simt.cpp"}) {
    std::ifstream in(std::string(BELAY_SOURCE_ROOT) + "/kernels/cuda/emulation/" + file);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    for (const std::string& name : cuda_code_names(text.str())) used.insert(name);
  }
  CHECK(used.size() >= 12);
  for (const std::string& name : used) {
    INFO(name);
    REQUIRE(named.count(name) == 1);
    CHECK(std::string(cudaGetErrorString(named[name])) != "unrecognized error code");
  }
  CHECK(std::string(cudaGetErrorString(cudaErrorNotReady)) == "device not ready");
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidResourceHandle)) == "invalid resource handle");
  CHECK(std::string(cudaGetErrorString(cudaErrorNotSupported)) == "operation not supported");
  CHECK(std::string(cudaGetErrorName(static_cast<cudaError_t>(12345))) == "unrecognized error code");
  CHECK(std::string(cudaGetErrorString(static_cast<cudaError_t>(12345))) == "unrecognized error code");
}
