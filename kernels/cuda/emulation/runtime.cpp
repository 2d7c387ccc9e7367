// The CUDA runtime API as the emulated device answers it. The seam is the runtime's own C
// interface: cuda_backend.cpp and pinned_transfers.cpp are compiled unchanged against
// <cuda_runtime.h> and, in the emulated build, linked with these definitions instead of
// libcudart, so the backend code CI runs is the code a GPU runs.
// The device is an H200 as far as its properties go (132 SMs, 228 KiB of shared memory per
// SM, 227 KiB per block with the opt-in) with host memory behind it. Each stream is a queue
// of its own; the device runs the work that nothing holds back in an order the seed draws,
// at moments the seed draws (at once, or only when the host waits), so host code that reads
// a result before waiting for it, rewrites a buffer a copy has not consumed yet, or forgets
// an event between two streams, sees what it could see on a GPU. The calls refuse what the
// real runtime refuses, with its error codes, set the last error as it does, and a fault in a
// kernel is sticky: every later call returns it, as after a fault on a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/emulation/simt_internal.h"

namespace belay::emu {
namespace {

constexpr size_t kSharedPerBlockDefault = 48 << 10;
constexpr size_t kSharedPerBlockOptin = 227 << 10;
constexpr size_t kSharedPerSm = 228 << 10;
constexpr int kSmCount = 132;
constexpr int kMaxThreadsPerSm = 2048;
constexpr int kMaxBlocksPerSm = 32;
constexpr size_t kMaxPending = 64;  // how far the device may lag behind the host, in operations

struct Allocation {
  size_t bytes;
  bool pinned;
};

// One operation of a stream: a kernel, a copy, a memset, an event's record or wait, or an
// operation of the emulated NCCL. Besides the work before it on its stream it waits for the
// operations in `after` (of other streams): an event it waits for, or what the legacy default
// stream's implicit synchronisation adds.
// `ready`, if set, holds it back until it returns true: work another agent does (the emulated
// NCCL's ring, on its progress thread) that the stream's later work must wait for.
struct Op {
  uint64_t id;
  std::vector<uint64_t> after;
  std::function<void()> run;
  std::function<bool()> ready;
};

struct Stream {
  bool legacy = false;     // stream 0 (and cudaStreamLegacy)
  bool blocking = true;    // false: cudaStreamNonBlocking, which never synchronises with stream 0
  bool destroyed = false;  // destroyed with work pending: that work still runs, then it goes
  std::deque<Op> ops;
  uint64_t last = 0;  // the last operation enqueued here, run or not (0: none yet)
};

struct Event {
  uint64_t op = 0;  // the marker its last cudaEventRecord enqueued (0: never recorded)
};

struct Runtime {
  std::recursive_mutex mutex;
  std::map<const char*, Allocation> allocations;  // by base address
  size_t device_bytes = 0;
  size_t device_limit = 0;
  cudaError_t sticky = cudaSuccess;
  std::string sticky_message;
  // The streams in creation order (the legacy default stream first): an order that does not
  // depend on where the heap put them, so a seed replays the same schedule.
  std::list<Stream> streams;
  std::map<uint64_t, Stream*> pending;  // every operation not yet run, by id, with its stream
  uint64_t next_op = 1;
  std::map<const void*, size_t> max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  // Events belong to the context until destroyed, as in the real runtime (which reclaims the
  // rest when the process ends): kept here, they are never reported as leaks.
  std::map<const void*, std::unique_ptr<Event>> events;
  std::mt19937_64 rng;
  bool immediate = false;  // BELAY_EMU_STREAM=immediate: every operation runs when enqueued
  int device_count = 1;    // BELAY_EMU_DEVICES
  int current_device = 0;

  Runtime() {
    reseed(emulator_seed());
    streams.emplace_back().legacy = true;
    // BELAY_EMU_DEVICE_MEMORY: the emulated device's memory in MiB (default 4096), so that
    // out-of-memory paths can be reached with small tests.
    const char* mem = std::getenv("BELAY_EMU_DEVICE_MEMORY");
    device_limit = (mem && *mem ? std::strtoull(mem, nullptr, 10) : 4096ull) << 20;
    const char* mode = std::getenv("BELAY_EMU_STREAM");
    immediate = mode && std::string(mode) == "immediate";
    // BELAY_EMU_DEVICES: how many devices this process sees (default 1), so that two ranks
    // on one machine can each be given a device of their own, as on a node with N GPUs.
    const char* devices = std::getenv("BELAY_EMU_DEVICES");
    if (devices && *devices) device_count = std::max(1, std::min(64, std::atoi(devices)));
  }
  void reseed(uint64_t seed) { rng.seed(seed * 0x9e3779b97f4a7c15ull + 17); }
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: other statics' destructors may free memory
  return *r;
}

// ---- The last error ------------------------------------------------------------------------
// As the real runtime keeps it (CUDA Runtime API, "Error Handling",
// https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__ERROR.html):
//  - cudaGetLastError "returns the last error that has been produced by any of the runtime
//    calls in the same host thread and resets it to cudaSuccess"; cudaPeekAtLastError "does
//    not reset the error". So it is per host thread, set by every call that fails, and left
//    alone by every call that succeeds: only cudaGetLastError clears it.
//  - cudaErrorNotReady "is not actually an error, but must be indicated differently than
//    cudaSuccess" (enum cudaError, "Data types used by CUDA Runtime",
//    https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html): cudaEventQuery
//    and cudaStreamQuery return it and do not record it (not_ready()).
//  - after a fault in a kernel (cudaErrorLaunchFailure, cudaErrorMisalignedAddress), "any
//    further CUDA work will return the same error" (same page): the fault is sticky for the
//    context (the process), every later call that touches the device returns it, and
//    cudaGetLastError / cudaPeekAtLastError return it in every thread and cannot clear it.
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}
cudaError_t not_ready() { return cudaErrorNotReady; }  // not an error: the last error stays as it was

const Allocation* find(const void* p, size_t bytes, const char** base_out = nullptr) {
  Runtime& r = rt();
  auto it = r.allocations.upper_bound(static_cast<const char*>(p));
  if (it == r.allocations.begin()) return nullptr;
  --it;
  const char* c = static_cast<const char*>(p);
  if (c < it->first || c + bytes > it->first + it->second.bytes) return nullptr;
  if (base_out) *base_out = it->first;
  return &it->second;
}
bool is_device(const void* p, size_t bytes) {
  const Allocation* a = find(p, bytes);
  return a && !a->pinned;
}
bool is_pinned(const void* p, size_t bytes) {
  const Allocation* a = find(p, bytes);
  return a && a->pinned;
}
// Memory a kernel or a copy engine can reach: device memory, and pinned host memory
// (mapped, with unified addressing).
bool device_visible(const void* p, size_t bytes) { return find(p, bytes) != nullptr; }

// ---- Streams -------------------------------------------------------------------------------
// The device runs one operation at a time: the head of a stream whose `after` have all run,
// drawn by the seed among every such head. Only what orders work in CUDA orders it here: a
// stream's own order, events waited for, the legacy default stream's implicit
// synchronisation, and the host's waits (which run exactly what they wait for, no more).

bool is_pending(uint64_t op) { return op != 0 && rt().pending.count(op) != 0; }

// The stream a handle names. 0 and cudaStreamLegacy are the legacy default stream, the one
// belay uses. cudaStreamPerThread (and nvcc's --default-stream per-thread, whose renamed
// entry points this file does not define, so such a build does not link) is refused: belay
// never uses it, and modelling it would need a stream per host thread.
Stream* find_stream(cudaStream_t handle, cudaError_t& error) {
  Runtime& r = rt();
  if (handle == nullptr || handle == cudaStreamLegacy) return &r.streams.front();
  error = handle == cudaStreamPerThread ? cudaErrorNotSupported : cudaErrorInvalidResourceHandle;
  for (Stream& s : r.streams)
    if (reinterpret_cast<cudaStream_t>(&s) == handle && !s.destroyed) return &s;
  return nullptr;
}

// A fault lost the context: nothing queued will run.
void lose_context() {
  Runtime& r = rt();
  for (Stream& s : r.streams) s.ops.clear();
  r.streams.remove_if([](const Stream& s) { return s.destroyed; });
  r.pending.clear();
}

// Runs the head of s. A kernel's fault makes the error sticky (run_grid reports it through
// kernel_fault) and drops everything still queued.
void execute(Stream& s) {
  Runtime& r = rt();
  Op op = std::move(s.ops.front());
  s.ops.pop_front();
  r.pending.erase(op.id);
  if (s.destroyed && s.ops.empty()) r.streams.remove_if([&](const Stream& t) { return &t == &s; });
  op.run();
  if (r.sticky != cudaSuccess) lose_context();
}

// Runs one operation that nothing holds back, drawn by the seed; only among `among` if given.
// Returns false if there is none.
bool run_one(const std::set<uint64_t>* among) {
  Runtime& r = rt();
  std::vector<Stream*> ready;
  for (Stream& s : r.streams) {
    if (s.ops.empty() || (among && !among->count(s.ops.front().id))) continue;
    const Op& head = s.ops.front();
    if (std::none_of(head.after.begin(), head.after.end(), is_pending) && (!head.ready || head.ready()))
      ready.push_back(&s);
  }
  if (ready.empty()) return false;
  execute(*ready[r.rng() % ready.size()]);
  return true;
}

// Every operation `target` waits for, itself included: what is before it on its stream and,
// through their `after`, on other streams, closed over.
std::set<uint64_t> needed_for(uint64_t target) {
  Runtime& r = rt();
  std::set<uint64_t> needed;
  std::vector<uint64_t> work{target};
  while (!work.empty()) {
    const uint64_t id = work.back();
    work.pop_back();
    auto it = r.pending.find(id);
    if (it == r.pending.end() || needed.count(id)) continue;
    for (const Op& op : it->second->ops) {  // the stream's pending prefix up to id
      if (op.id > id) break;
      if (needed.insert(op.id).second) work.insert(work.end(), op.after.begin(), op.after.end());
    }
  }
  return needed;
}

// Whether some pending operation is held back only by its stall (see Op::ready): the
// agent that will release it is still working, so a host that waits must wait for it.
bool stalled() {
  for (const Stream& s : rt().streams)
    if (!s.ops.empty() && s.ops.front().ready && !s.ops.front().ready()) return true;
  return false;
}

// The host waits for `target`: what it waits for runs (in an order the seed draws), and
// nothing else, so work the host did not wait for can still be pending after. A stalled
// operation is waited for only when `wait` (a call that waits for the device); a launch
// never blocks the host on it, as a GPU's stream behind a NCCL kernel does not.
void run_until(uint64_t target, bool wait = true) {
  if (!is_pending(target)) return;
  const std::set<uint64_t> needed = needed_for(target);
  while (is_pending(target)) {
    if (run_one(&needed)) continue;
    if (!wait || !stalled()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}
void run_all() {
  while (!rt().pending.empty()) {
    if (run_one(nullptr)) continue;
    if (!stalled()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The adversary: after each enqueue the device may run nothing (it lags behind, up to
// kMaxPending operations), or some of what is ready, in an order the seed draws.
void device_moves_on(uint64_t just_enqueued) {
  Runtime& r = rt();
  if (r.immediate) return run_until(just_enqueued, /*wait=*/false);
  if (r.rng() & 1u) {
    const uint64_t steps = 1 + r.rng() % r.pending.size();
    for (uint64_t i = 0; i < steps && run_one(nullptr); ++i) {
    }
  }
  while (r.pending.size() > kMaxPending && run_one(nullptr)) {
  }
}

// Queues `run` on s and returns its id. Besides s's own order, the legacy default stream's
// rules (CUDA Runtime API, "Stream synchronization behavior",
// https://docs.nvidia.com/cuda/cuda-runtime-api/stream-sync-behavior.html): "when an action is
// taken in the legacy stream such as a kernel launch or cudaStreamWaitEvent(), the legacy
// stream first waits on all blocking streams, the action is queued in the legacy stream, and
// then all blocking streams wait on the legacy stream"; a cudaStreamNonBlocking stream does
// neither.
uint64_t enqueue(Stream& s, std::function<void()> run, std::vector<uint64_t> after = {},
                 std::function<bool()> ready = {}) {
  Runtime& r = rt();
  const Stream& legacy = r.streams.front();
  if (s.legacy) {
    for (const Stream& t : r.streams)
      if (!t.legacy && t.blocking && is_pending(t.last)) after.push_back(t.last);
  } else if (s.blocking && is_pending(legacy.last)) {
    after.push_back(legacy.last);
  }
  const uint64_t id = r.next_op++;
  s.ops.push_back(Op{id, std::move(after), std::move(run), std::move(ready)});
  s.last = id;
  r.pending[id] = &s;
  device_moves_on(id);
  return id;
}

// ---- Error names and strings -----------------------------------------------------------------
const char* plain_error_string(cudaError_t e);

// The fault's own error (cudaErrorLaunchFailure, or cudaErrorMisalignedAddress), sticky, with
// the report in its message.
void kernel_fault(const std::string& report, cudaError_t error) {
  Runtime& r = rt();
  r.sticky = error;
  r.sticky_message = std::string(plain_error_string(error)) + " (belay-emu: " + report + ")";
}

// The sticky fault's message names the kernel and what it did.
const char* error_string(cudaError_t e) {
  return e != cudaSuccess && e == rt().sticky ? rt().sticky_message.c_str() : plain_error_string(e);
}

// Every code this emulator returns, with the real runtime's name and string for it (the
// runtime answers "unrecognized error code" for a code it does not know).
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};
const ErrorText* error_text(cudaError_t e) {
  for (const ErrorText& t : kErrorTexts)
    if (t.code == e) return &t;
  return nullptr;
}
const char* plain_error_string(cudaError_t e) {
  const ErrorText* t = error_text(e);
  return t ? t->text : "unrecognized error code";
}

// The registered __launch_bounds__, by kernel name (no template arguments).
std::map<std::string, int>& launch_bounds() {
  static auto* bounds = new std::map<std::string, int>;  // filled during static initialisation
  return *bounds;
}

std::string base_name(const std::string& name) { return name.substr(0, name.find('<')); }

// The stream a launch or another operation is queued on, or nullptr with the thread's last
// error set: the context was lost to a fault, or the handle is not a stream.
Stream* stream_to_enqueue(cudaStream_t stream) {
  if (rt().sticky != cudaSuccess) {
    fail(rt().sticky);
    return nullptr;
  }
  cudaError_t error = cudaSuccess;
  Stream* s = find_stream(stream, error);
  if (!s) fail(error);
  return s;
}

// A launch's configuration as the driver checks it; cudaSuccess or the error it refuses with.
cudaError_t launch_error(const void* kernel, const std::string& name, dim3 grid, dim3 block, size_t smem) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return cudaErrorInvalidConfiguration;
  // More threads than the kernel's __launch_bounds__: the driver refuses the launch.
  auto bound = launch_bounds().find(base_name(name));
  if (bound != launch_bounds().end() && threads > static_cast<uint64_t>(bound->second))
    return cudaErrorLaunchOutOfResources;
  auto it = rt().max_dynamic_smem.find(kernel);
  const size_t allowed = it == rt().max_dynamic_smem.end() ? kSharedPerBlockDefault : it->second;
  // Above 48 KiB without the opt-in, or above the opt-in.
  return smem > allowed ? cudaErrorInvalidValue : cudaSuccess;
}

}  // namespace

bool device_allocation(const void* p, uintptr_t* lo, uintptr_t* hi) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  const char* base = nullptr;
  const Allocation* a = find(p, 1, &base);
  if (!a || a->pinned) return false;
  *lo = reinterpret_cast<uintptr_t>(base);
  *hi = *lo + a->bytes;
  return true;
}

bool register_launch_bounds(const char* kernel, int max_threads) {
  auto [it, fresh] = launch_bounds().emplace(kernel, max_threads);
  if (!fresh && max_threads < it->second) it->second = max_threads;  // two kernels of one name: the stricter
  return true;
}

void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            LaunchBody* body) {
  std::unique_ptr<LaunchBody> owned(body);
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  Stream* s = stream_to_enqueue(stream);
  if (!s) return;
  const std::string name_of_kernel = short_kernel_name(name);
  const cudaError_t error = launch_error(kernel, name_of_kernel, grid, block, smem);
  if (error != cudaSuccess) {
    fail(error);
    return;
  }
  auto g = std::make_shared<GridLaunch>();
  g->kernel = kernel;
  g->name = name_of_kernel;
  g->grid = grid;
  g->block = block;
  g->smem = smem;
  g->body = std::move(owned);
  enqueue(*s, [g] {
    const std::string report = run_grid(*g);
    if (!report.empty()) kernel_fault(report, g->fault_error);
  });
}

void enqueue_on_stream(cudaStream_t stream, std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  Stream* s = stream_to_enqueue(stream);
  if (!s) return;  // the context is lost, or not a stream: the operation never runs
  enqueue(*s, std::move(op));
}

void enqueue_stall_on_stream(cudaStream_t stream, std::function<bool()> done) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  Stream* s = stream_to_enqueue(stream);
  if (!s) return;  // the context is lost, or not a stream: the operation never runs
  enqueue(*s, [] {}, {}, std::move(done));
}

void reseed_stream_order(uint64_t seed) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  rt().reseed(seed);
}

}  // namespace belay::emu

using belay::emu::enqueue;
using belay::emu::fail;
using belay::emu::rt;
using Lock = std::lock_guard<std::recursive_mutex>;

#define BELAY_EMU_STICKY()                                   \
  do {                                                       \
    if (rt().sticky != cudaSuccess) return fail(rt().sticky); \
  } while (0)

extern "C" {

cudaError_t cudaGetLastError(void) {
  Lock lock(rt().mutex);
  if (rt().sticky != cudaSuccess) return rt().sticky;
  const cudaError_t e = belay::emu::t_last_error;
  belay::emu::t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  Lock lock(rt().mutex);
  return rt().sticky != cudaSuccess ? rt().sticky : belay::emu::t_last_error;
}

const char* cudaGetErrorString(cudaError_t error) { return belay::emu::error_string(error); }

const char* cudaGetErrorName(cudaError_t error) {
  const belay::emu::ErrorText* t = belay::emu::error_text(error);
  return t ? t->name : "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = rt().device_count;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = rt().current_device;
  return cudaSuccess;
}

// Each device of BELAY_EMU_DEVICES is the same emulated H200 (one memory, one set of streams:
// a process uses one device, as belay does).
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rt().device_count) return fail(cudaErrorInvalidDevice);
  rt().current_device = device;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) { return cudaRuntimeGetVersion(v); }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= rt().device_count) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "NVIDIA H200 (belay SIMT emulator)");
  prop->totalGlobalMem = rt().device_limit;
  prop->sharedMemPerBlock = belay::emu::kSharedPerBlockDefault;
  prop->sharedMemPerBlockOptin = belay::emu::kSharedPerBlockOptin;
  prop->sharedMemPerMultiprocessor = belay::emu::kSharedPerSm;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = belay::emu::kSmCount;
  prop->maxThreadsPerMultiProcessor = belay::emu::kMaxThreadsPerSm;
  prop->maxBlocksPerMultiProcessor = belay::emu::kMaxBlocksPerSm;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->l2CacheSize = 60 << 20;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= rt().device_count) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = belay::emu::kSmCount; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(belay::emu::kSharedPerBlockOptin); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(belay::emu::kSharedPerBlockDefault); break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Lock lock(rt().mutex);
  if (!ptr) return fail(cudaErrorInvalidValue);
  BELAY_EMU_STICKY();
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  if (size > rt().device_limit - rt().device_bytes) return fail(cudaErrorMemoryAllocation);
  void* p = nullptr;
  // Exactly `size` bytes (AddressSanitizer reports the first byte past them), aligned as
  // cudaMalloc aligns.
  if (posix_memalign(&p, 256, size) != 0) return fail(cudaErrorMemoryAllocation);
  rt().allocations[static_cast<const char*>(p)] = {size, false};
  rt().device_bytes += size;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  Lock lock(rt().mutex);
  if (!ptr) return cudaSuccess;
  belay::emu::run_all();  // cudaFree waits for the device, as the real one does
  BELAY_EMU_STICKY();
  auto it = rt().allocations.find(static_cast<const char*>(ptr));
  if (it == rt().allocations.end() || it->second.pinned) return fail(cudaErrorInvalidValue);
  rt().device_bytes -= it->second.bytes;
  rt().allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  Lock lock(rt().mutex);
  if (!ptr) return fail(cudaErrorInvalidValue);
  BELAY_EMU_STICKY();
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size == 0 ? 1 : size) != 0) return fail(cudaErrorMemoryAllocation);
  rt().allocations[static_cast<const char*>(p)] = {size, true};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  (void)flags;  // portable, mapped or write-combined: all plain host memory here
  return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void* ptr) {
  Lock lock(rt().mutex);
  if (!ptr) return cudaSuccess;
  belay::emu::run_all();
  BELAY_EMU_STICKY();
  auto it = rt().allocations.find(static_cast<const char*>(ptr));
  if (it == rt().allocations.end() || !it->second.pinned) return fail(cudaErrorInvalidValue);
  rt().allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  Lock lock(rt().mutex);
  if (!device || flags != 0) return fail(cudaErrorInvalidValue);
  BELAY_EMU_STICKY();
  const char* base = nullptr;
  const belay::emu::Allocation* a = belay::emu::find(host, 1, &base);
  if (!a || !a->pinned) return fail(cudaErrorInvalidValue);
  *device = host;  // unified addressing: the same address
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  Lock lock(rt().mutex);
  if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
  BELAY_EMU_STICKY();
  *total = rt().device_limit;
  *free_bytes = rt().device_limit - rt().device_bytes;
  return cudaSuccess;
}

// Whether a copy of `count` bytes between these pointers is one the runtime accepts for
// `kind`; cudaMemcpyDefault infers the direction from the pointers.
static bool copy_valid(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  using belay::emu::device_visible;
  switch (kind) {
    case cudaMemcpyHostToDevice: return device_visible(dst, count);
    case cudaMemcpyDeviceToHost: return device_visible(src, count);
    case cudaMemcpyDeviceToDevice: return device_visible(dst, count) && device_visible(src, count);
    case cudaMemcpyHostToHost: return true;
    case cudaMemcpyDefault: return true;
    default: return false;
  }
}
// When a copy or memset makes the host wait, per the CUDA Runtime API's "API synchronization
// behavior" (https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html):
//  - cudaMemcpy: "for transfers from device memory to device memory, no host-side
//    synchronization is performed"; every other direction returns once the copy is done (or,
//    from pageable memory, staged after a stream sync, which the host cannot tell apart);
//  - cudaMemcpyAsync: into pageable host memory it "will return only once the copy has
//    completed"; from pageable memory the bytes are staged before it returns (the caller may
//    reuse its buffer at once) and reach the device in stream order;
//  - cudaMemset "is asynchronous with respect to the host except when the target is pinned
//    host memory".
// A synchronous call is issued on the legacy default stream and waits for its own operation
// only (and so, by that stream's rules, for the blocking streams; not for non-blocking ones).

// The stream `handle` names, or nullptr with the call's error recorded in `error`.
static belay::emu::Stream* stream_or_error(cudaStream_t handle, cudaError_t& error) {
  belay::emu::Stream* s = belay::emu::find_stream(handle, error);
  if (!s) fail(error);
  return s;
}

static belay::emu::Stream& legacy_stream() { return rt().streams.front(); }

// Enqueues op on s; if the host waits for it, returns once it has run.
static cudaError_t issue(belay::emu::Stream& s, std::function<void()> op, bool host_waits) {
  const uint64_t id = enqueue(s, std::move(op));
  if (host_waits) belay::emu::run_until(id);
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!dst || !src || !copy_valid(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  using belay::emu::is_device;
  const bool device_to_device = is_device(dst, count) && is_device(src, count);
  return issue(legacy_stream(), [dst, src, count] { std::memmove(dst, src, count); }, !device_to_device);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  if (count == 0) return cudaSuccess;
  if (!dst || !src || !copy_valid(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  using belay::emu::is_device;
  using belay::emu::is_pinned;
  const bool src_pageable = !is_device(src, count) && !is_pinned(src, count);
  const bool dst_pageable = !is_device(dst, count) && !is_pinned(dst, count);
  if (src_pageable) {
    auto staged = std::make_shared<std::string>(static_cast<const char*>(src), count);
    return issue(*s, [dst, staged] { std::memmove(dst, staged->data(), staged->size()); }, dst_pageable);
  }
  // Pinned or device memory on both sides is a true asynchronous copy, made when its turn comes.
  return issue(*s, [dst, src, count] { std::memmove(dst, src, count); }, dst_pageable);
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!belay::emu::device_visible(dst, count)) return fail(cudaErrorInvalidValue);
  return issue(legacy_stream(), [dst, value, count] { std::memset(dst, value, count); },
               belay::emu::is_pinned(dst, count));
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  if (count == 0) return cudaSuccess;
  if (!belay::emu::device_visible(dst, count)) return fail(cudaErrorInvalidValue);
  return issue(*s, [dst, value, count] { std::memset(dst, value, count); }, false);
}

// The synchronising calls return a fault of earlier work ("this function may also return
// error codes from previous, asynchronous launches", on each of their pages).
cudaError_t cudaDeviceSynchronize(void) {
  Lock lock(rt().mutex);
  belay::emu::run_all();
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(rt().mutex);
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  belay::emu::run_until(s->last);
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

// cudaSuccess once every operation of the stream has run, else cudaErrorNotReady, which is not
// recorded as the last error (see fail()).
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(rt().mutex);
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  BELAY_EMU_STICKY();
  if (!s->ops.empty() && (rt().rng() & 1u)) belay::emu::run_one(nullptr);  // the device moves on a little
  BELAY_EMU_STICKY();
  return s->ops.empty() ? cudaSuccess : belay::emu::not_ready();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) return fail(cudaErrorInvalidValue);
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  belay::emu::Stream& s = rt().streams.emplace_back();
  s.blocking = (flags & cudaStreamNonBlocking) == 0;
  *stream = reinterpret_cast<cudaStream_t>(&s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

// Work still queued on a destroyed stream runs: "the function will return immediately and the
// resources associated with stream will be released automatically once the device has
// completed all work in stream" (cudaStreamDestroy).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(rt().mutex);
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  if (s->legacy) return fail(cudaErrorInvalidResourceHandle);  // stream 0 is not a stream one created
  s->destroyed = true;
  if (s->ops.empty()) rt().streams.remove_if([&](const belay::emu::Stream& t) { return &t == s; });
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  (void)flags;  // timing, blocking sync or not: the emulator keeps no device time either way
  if (!event) return fail(cudaErrorInvalidValue);
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  auto e = std::make_unique<belay::emu::Event>();
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  rt().events[e.get()] = std::move(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

// A recorded event destroyed before it completes is "released automatically once the device
// has completed" it (cudaEventDestroy): the marker it recorded stays queued.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(rt().mutex);
  return rt().events.erase(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

static belay::emu::Event* event_of(cudaEvent_t event) {
  auto it = rt().events.find(event);
  return it == rt().events.end() ? nullptr : it->second.get();
}

// The event captures what is queued on the stream now: a marker operation, done once all of
// it has run (and, on stream 0, the blocking streams' work too, by that stream's rules).
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(rt().mutex);
  belay::emu::Event* e = event_of(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  BELAY_EMU_STICKY();
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  e->op = enqueue(*s, [] {});
  return cudaSuccess;
}

// Later work on the stream waits for the event's last record as of this call; an event never
// recorded is "as if the record has already completed" (cudaStreamWaitEvent). A marker is
// queued all the same: on stream 0 it is an action of that stream, with its implicit waits.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Lock lock(rt().mutex);
  belay::emu::Event* e = event_of(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventWaitDefault) return fail(cudaErrorInvalidValue);  // external waits: graphs only
  BELAY_EMU_STICKY();
  cudaError_t error = cudaSuccess;
  belay::emu::Stream* s = stream_or_error(stream, error);
  if (!s) return error;
  std::vector<uint64_t> after;
  if (belay::emu::is_pending(e->op)) after.push_back(e->op);
  enqueue(*s, [] {}, std::move(after));
  return cudaSuccess;
}

// cudaSuccess once the captured work has run (or the event was never recorded), else
// cudaErrorNotReady, which is not recorded as the last error (see fail()).
cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(rt().mutex);
  belay::emu::Event* e = event_of(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  BELAY_EMU_STICKY();
  if (belay::emu::is_pending(e->op) && (rt().rng() & 1u)) belay::emu::run_one(nullptr);  // the device moves on
  BELAY_EMU_STICKY();
  return belay::emu::is_pending(e->op) ? belay::emu::not_ready() : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(rt().mutex);
  belay::emu::Event* e = event_of(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  belay::emu::run_until(e->op);
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(rt().mutex);
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!event_of(start) || !event_of(end)) return fail(cudaErrorInvalidResourceHandle);
  BELAY_EMU_STICKY();
  *ms = 0.0f;  // the emulator keeps no device time
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  Lock lock(rt().mutex);
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  BELAY_EMU_STICKY();
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) > belay::emu::kSharedPerBlockOptin) return fail(cudaErrorInvalidValue);
      rt().max_dynamic_smem[func] = static_cast<size_t>(value);
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      if (value < -1 || value > 100) return fail(cudaErrorInvalidValue);
      return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  Lock lock(rt().mutex);
  if (!attr || !func) return fail(cudaErrorInvalidValue);
  *attr = cudaFuncAttributes{};
  auto it = rt().max_dynamic_smem.find(func);
  attr->maxDynamicSharedSizeBytes =
      static_cast<int>(it == rt().max_dynamic_smem.end() ? belay::emu::kSharedPerBlockDefault : it->second);
  attr->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

// Blocks per SM from threads and shared memory (the emulator knows no register counts; the
// ptxas report, tests/kernels/check_ptxas.sh, is where those are checked).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func, int block_size,
                                                          size_t dynamic_smem) {
  Lock lock(rt().mutex);
  if (!num_blocks || !func || block_size <= 0) return fail(cudaErrorInvalidValue);
  auto it = rt().max_dynamic_smem.find(func);
  const size_t allowed = it == rt().max_dynamic_smem.end() ? belay::emu::kSharedPerBlockDefault : it->second;
  if (dynamic_smem > allowed) {
    *num_blocks = 0;
    return cudaSuccess;
  }
  const size_t per_block = dynamic_smem + 1024;  // the runtime reserves 1 KiB per block
  int blocks = std::min(belay::emu::kMaxBlocksPerSm, belay::emu::kMaxThreadsPerSm / block_size);
  blocks = std::min(blocks, static_cast<int>(belay::emu::kSharedPerSm / per_block));
  *num_blocks = blocks;
  return cudaSuccess;
}

}  // extern "C"
