#include "engine/allocator.h"

#include <algorithm>

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {
thread_local const AllocationPurpose* g_purpose = nullptr;
}  // namespace

AllocationPurpose::AllocationPurpose(std::string what) : owned_(std::move(what)), outer_(g_purpose) { g_purpose = this; }
AllocationPurpose::AllocationPurpose(const char* what, int64_t step) : what_(what), step_(step), outer_(g_purpose) {
  g_purpose = this;
}
AllocationPurpose::~AllocationPurpose() { g_purpose = outer_; }
std::string AllocationPurpose::current() {
  if (!g_purpose) return "";
  if (!g_purpose->what_) return g_purpose->owned_;
  return std::string(g_purpose->what_) + " " + std::to_string(g_purpose->step_);
}

std::string out_of_memory_message(size_t bytes) {
  const std::string what = AllocationPurpose::current();
  return "out of memory allocating " + std::to_string(bytes) + " bytes for " + (what.empty() ? "a tensor" : what);
}

CachingAllocator::~CachingAllocator() { release_cached(); }

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) bytes = 1;
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.requests;
  void* ptr = nullptr;
  auto it = free_blocks_.find(bytes);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= bytes;
  } else {
    ptr = raw_.alloc(bytes);
    if (!ptr && stats_.bytes_cached > 0) {
      // Blocks of other sizes sit in the cache: give them back and try once more (what
      // PyTorch's allocator does before it reports an out-of-memory).
      release_cached_locked();
      ptr = raw_.alloc(bytes);
    }
    if (!ptr)
      throw Error(out_of_memory_message(bytes) + " (" + std::to_string(stats_.bytes_in_use) +
                  " bytes in use, nothing cached)");
    ++stats_.system_allocs;
  }
  stats_.bytes_in_use += bytes;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_held = std::max(stats_.peak_bytes_held, stats_.bytes_in_use + stats_.bytes_cached);
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  if (bytes == 0) bytes = 1;
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_[bytes].push_back(ptr);
  stats_.bytes_in_use -= bytes;
  stats_.bytes_cached += bytes;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [bytes, blocks] : free_blocks_)
    for (void* p : blocks) raw_.free(p);
  free_blocks_.clear();
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_held = stats_.bytes_in_use + stats_.bytes_cached;
}

CachingAllocator& allocator_for(Device device) {
  // One allocator per device kind (multi-GPU indices come with data parallelism).
  // Leaked on purpose: tensors in static storage may be freed after main returns.
  static CachingAllocator* cpu = new CachingAllocator(backend_for(Device::cpu()).raw_memory());
  if (device.is_cpu()) return *cpu;
  static CachingAllocator* cuda = new CachingAllocator(backend_for(Device::cuda()).raw_memory());
  return *cuda;
}

}  // namespace belay
