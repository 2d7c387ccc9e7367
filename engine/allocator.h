// Internal, but for allocator_for(device).stats(): how a user checks that a training loop
// allocates nothing in steady state.
// Buffer reuse: a caching allocator per device. A freed block goes back to a free list
// keyed by its exact size, so a steady-state training step (same shapes every step)
// takes every buffer from the cache and asks the system for nothing. The counters are
// what benchmarks and tests read to prove that. When the system refuses a block while
// others are cached, the cache is emptied and the request tried once more before it is
// reported as out of memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/device.h"

namespace belay {

struct AllocatorStats {
  uint64_t requests = 0;        // every allocate() call
  uint64_t system_allocs = 0;   // calls that reached the system (cache misses)
  size_t bytes_in_use = 0;      // handed out and not yet freed
  size_t peak_bytes_in_use = 0;
  size_t bytes_cached = 0;      // freed, kept for reuse
  size_t peak_bytes_held = 0;   // the most in use + cached at once: what the system gave
};

// How a device gets and returns raw memory; the backend provides one per device.
struct RawMemory {
  void* (*alloc)(size_t bytes) = nullptr;  // nullptr when the system has no memory left
  void (*free)(void* ptr) = nullptr;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(RawMemory raw) : raw_(raw) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);
  void deallocate(void* ptr, size_t bytes);
  void release_cached();  // give every cached block back to the system
  AllocatorStats stats() const;
  void reset_peak();

 private:
  void release_cached_locked();  // release_cached with mutex_ held

  RawMemory raw_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;
  AllocatorStats stats_;
};

CachingAllocator& allocator_for(Device device);

// What the allocations of this thread are for, while one is alive ("the model's
// parameters", "the batch of step 12"): an out-of-memory error then says "out of memory
// allocating N bytes for <what>". Scopes nest; the innermost names the purpose.
class AllocationPurpose {
 public:
  explicit AllocationPurpose(std::string what);
  // "<what> <step>", formatted only if an allocation fails: a training step opens one of
  // these every step and must not allocate for it.
  AllocationPurpose(const char* what, int64_t step);
  ~AllocationPurpose();
  AllocationPurpose(const AllocationPurpose&) = delete;
  AllocationPurpose& operator=(const AllocationPurpose&) = delete;
  static std::string current();  // "" outside every scope

 private:
  std::string owned_;
  const char* what_ = nullptr;  // with step_, when not owned_
  int64_t step_ = -1;
  const AllocationPurpose* outer_;
};

// "out of memory allocating N bytes for <purpose>" (or "for a tensor" outside a scope).
std::string out_of_memory_message(size_t bytes);

}  // namespace belay
