// The CUDA runtime API as the emulated device answers it. The seam is the runtime's own C
// interface: cuda_backend.cpp and pinned_transfers.cpp are compiled unchanged against
// <cuda_runtime.h> and, in the emulated build, linked with these definitions instead of
// libcudart, so the backend code CI runs is the code a GPU runs.
// The device is an H200 as far as its properties go (132 SMs, 228 KiB of shared memory per
// SM, 227 KiB per block with the opt-in) with host memory behind it. Work goes through one
// in-order stream queue that the seed drains at random moments (immediately, or only at the
// next synchronising call), so host code that reads a result before waiting for it, or
// rewrites a buffer a copy has not consumed yet, sees what it would see on a GPU. The calls
// refuse what the real runtime refuses, with its error codes, and a fault in a kernel is
// sticky: every later call returns it, as after a fault on a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "kernels/cuda/emulation/simt_internal.h"

namespace belay::emu {
namespace {

constexpr size_t kSharedPerBlockDefault = 48 << 10;
constexpr size_t kSharedPerBlockOptin = 227 << 10;
constexpr size_t kSharedPerSm = 228 << 10;
constexpr int kSmCount = 132;
constexpr int kMaxThreadsPerSm = 2048;
constexpr int kMaxBlocksPerSm = 32;

struct Allocation {
  size_t bytes;
  bool pinned;
};

struct Event {
  uint64_t seq = 0;  // done once this many queued operations have executed
};

struct Runtime {
  std::recursive_mutex mutex;
  std::map<const char*, Allocation> allocations;  // by base address
  size_t device_bytes = 0;
  size_t device_limit = 0;
  cudaError_t sticky = cudaSuccess;
  std::string sticky_message;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0, executed = 0;
  std::map<const void*, size_t> max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  // Events and streams belong to the context until destroyed, as in the real runtime (which
  // reclaims the rest when the process ends): kept here, they are never reported as leaks.
  std::map<const void*, std::unique_ptr<Event>> events;
  std::map<const void*, std::unique_ptr<char>> streams;
  std::mt19937_64 rng;
  int stream_mode = 0;  // 0: random drains (seeded), 1: every operation at once

  Runtime() {
    rng.seed(emulator_seed() * 0x9e3779b97f4a7c15ull + 17);
    // BELAY_EMU_DEVICE_MEMORY: the emulated device's memory in MiB (default 4096), so that
    // out-of-memory paths can be reached with small tests.
    const char* mem = std::getenv("BELAY_EMU_DEVICE_MEMORY");
    device_limit = (mem && *mem ? std::strtoull(mem, nullptr, 10) : 4096ull) << 20;
    const char* mode = std::getenv("BELAY_EMU_STREAM");
    stream_mode = mode && std::string(mode) == "immediate" ? 1 : 0;
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: other statics' destructors may free memory
  return *r;
}

thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

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

// Runs queued operations until `until` of them have executed. A kernel's fault makes the
// error sticky and drops what is queued behind it: the context is gone.
void drain(uint64_t until) {
  Runtime& r = rt();
  while (r.executed < until && !r.queue.empty()) {
    auto op = std::move(r.queue.front());
    r.queue.pop_front();
    ++r.executed;
    op();
    if (r.sticky != cudaSuccess) {
      r.queue.clear();
      r.executed = r.enqueued;
    }
  }
}
void drain_all() { drain(rt().enqueued); }

void enqueue(std::function<void()> op) {
  Runtime& r = rt();
  r.queue.push_back(std::move(op));
  ++r.enqueued;
  // The adversary: sometimes the device is idle and runs it now, sometimes it lags behind.
  if (r.stream_mode == 1 || r.queue.size() > 64 || (r.rng() & 1u)) drain_all();
}

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

const char* plain_error_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
  }
}

// The registered __launch_bounds__, by kernel name (no template arguments).
std::map<std::string, int>& launch_bounds() {
  static auto* bounds = new std::map<std::string, int>;  // filled during static initialisation
  return *bounds;
}

std::string base_name(const std::string& name) { return name.substr(0, name.find('<')); }

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
  (void)stream;  // one in-order queue serves every stream
  std::unique_ptr<LaunchBody> owned(body);
  Runtime& r = rt();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  if (r.sticky != cudaSuccess) {
    fail(r.sticky);
    return;
  }
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  // More threads than the kernel's __launch_bounds__: the driver refuses the launch.
  const std::string name_of_kernel = short_kernel_name(name);
  auto bound = launch_bounds().find(base_name(name_of_kernel));
  if (bound != launch_bounds().end() && threads > static_cast<uint64_t>(bound->second)) {
    fail(cudaErrorLaunchOutOfResources);
    return;
  }
  auto it = r.max_dynamic_smem.find(kernel);
  const size_t allowed = it == r.max_dynamic_smem.end() ? kSharedPerBlockDefault : it->second;
  if (smem > allowed) {
    fail(cudaErrorInvalidValue);  // above 48 KiB without the opt-in, or above the opt-in
    return;
  }
  auto g = std::make_shared<GridLaunch>();
  g->kernel = kernel;
  g->name = name_of_kernel;
  g->grid = grid;
  g->block = block;
  g->smem = smem;
  g->body = std::move(owned);
  enqueue([g] {
    const std::string report = run_grid(*g);
    if (!report.empty()) kernel_fault(report, g->fault_error);
  });
}

}  // namespace belay::emu

using belay::emu::drain;
using belay::emu::drain_all;
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
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) { return cudaRuntimeGetVersion(v); }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
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
  if (device != 0) return fail(cudaErrorInvalidDevice);
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
  drain_all();  // cudaFree waits for the device
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
  drain_all();
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
  const char* base = nullptr;
  const belay::emu::Allocation* a = belay::emu::find(host, 1, &base);
  if (!a || !a->pinned) return fail(cudaErrorInvalidValue);
  *device = host;  // unified addressing: the same address
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  Lock lock(rt().mutex);
  if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
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

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  Lock lock(rt().mutex);
  drain_all();  // a synchronous copy runs after everything queued before it
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!dst || !src || !copy_valid(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)stream;
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!dst || !src || !copy_valid(dst, src, count, kind)) return fail(cudaErrorInvalidValue);
  using belay::emu::is_device;
  using belay::emu::is_pinned;
  const bool src_host = !is_device(src, count), dst_host = !is_device(dst, count);
  if (src_host && !is_pinned(src, count)) {
    // From pageable memory the runtime stages the bytes before it returns: the caller may
    // reuse its buffer at once; the copy to the device still waits for its turn.
    auto staged = std::make_shared<std::string>(static_cast<const char*>(src), count);
    enqueue([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  if (dst_host && !is_pinned(dst, count)) {
    // Into pageable memory the call returns once the copy is done.
    drain_all();
    BELAY_EMU_STICKY();
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  // Pinned or device memory on both sides: a true asynchronous copy, made when its turn comes.
  enqueue([dst, src, count] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
  Lock lock(rt().mutex);
  drain_all();
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!belay::emu::device_visible(dst, count)) return fail(cudaErrorInvalidValue);
  std::memset(dst, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  Lock lock(rt().mutex);
  BELAY_EMU_STICKY();
  if (count == 0) return cudaSuccess;
  if (!belay::emu::device_visible(dst, count)) return fail(cudaErrorInvalidValue);
  enqueue([dst, value, count] { std::memset(dst, value, count); });
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Lock lock(rt().mutex);
  drain_all();
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return cudaDeviceSynchronize();
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (!stream) return fail(cudaErrorInvalidValue);
  Lock lock(rt().mutex);
  auto handle = std::make_unique<char>(0);
  *stream = reinterpret_cast<cudaStream_t>(handle.get());
  rt().streams[handle.get()] = std::move(handle);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(rt().mutex);
  return rt().streams.erase(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  (void)flags;
  if (!event) return fail(cudaErrorInvalidValue);
  Lock lock(rt().mutex);
  auto e = std::make_unique<belay::emu::Event>();
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  rt().events[e.get()] = std::move(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(rt().mutex);
  return rt().events.erase(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

static belay::emu::Event* event_of(cudaEvent_t event) {
  auto it = rt().events.find(event);
  return it == rt().events.end() ? nullptr : it->second.get();
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  (void)stream;
  Lock lock(rt().mutex);
  if (!event_of(event)) return fail(cudaErrorInvalidResourceHandle);
  BELAY_EMU_STICKY();
  event_of(event)->seq = rt().enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(rt().mutex);
  if (!event_of(event)) return fail(cudaErrorInvalidResourceHandle);
  BELAY_EMU_STICKY();
  const uint64_t seq = event_of(event)->seq;
  if (rt().executed < seq && (rt().rng() & 1u)) drain(rt().executed + 1);  // the device moves on a little
  BELAY_EMU_STICKY();
  // An event never recorded counts as complete, as on a GPU.
  return rt().executed >= seq ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(rt().mutex);
  if (!event_of(event)) return fail(cudaErrorInvalidResourceHandle);
  drain(event_of(event)->seq);
  BELAY_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  (void)start;
  (void)end;
  if (!ms) return fail(cudaErrorInvalidValue);
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
