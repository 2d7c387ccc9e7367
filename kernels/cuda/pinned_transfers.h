// Pinned host memory for the two transfers a training step makes without waiting for the
// GPU: uploads (batches, small scalars) and read_async's snapshots of device scalars. Both
// pools are owned by the CUDA backend, grow on first use and are reused after, so a
// steady-state step allocates no pinned memory and creates no event. Neither frees its
// buffers or events: the backend lives until exit, the driver releases them with the
// process, and freeing them from a static destructor would race the CUDA runtime's own
// teardown.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/backend.h"

namespace belay {

// Host -> device copies that return before the GPU has run them. cudaMemcpy from pageable
// memory waits for the stream, so every upload would stall the host behind the whole queue
// of a step. Instead the bytes go to a pinned staging buffer (the caller may reuse or free
// its source as soon as upload returns) and a cudaMemcpyAsync from there is enqueued.
class UploadStaging {
 public:
  // Bigger uploads (checkpoints, datasets moved at once) fall back to a plain cudaMemcpy:
  // they are not per-step traffic, and staging them would pin that much host memory.
  static constexpr size_t kMaxStagedBytes = size_t{64} << 20;
  // Staging buffers in flight at most: a step with several micro-batches uploads several
  // tensors; past this many uploads not yet run, the host waits for the oldest one.
  static constexpr size_t kMaxBuffers = 8;

  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  void upload(void* device_dst, const void* host_src, size_t bytes);

 private:
  struct Buffer {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy out of this buffer
  };
  Buffer& take(size_t bytes);

  std::mutex mutex_;
  std::vector<Buffer> buffers_;  // a ring, oldest use at next_
  size_t next_ = 0;
};

// Snapshots of device scalars on their way to the host (Backend::read_async). A slot is a
// pinned buffer of kMaxReadbackScalars floats, which the gather kernel writes through its
// device address, and the event recorded after that kernel.
class ReadbackPool {
 public:
  struct Slot {
    float* host = nullptr;
    float* device = nullptr;  // the same memory as the kernel addresses it
    cudaEvent_t done = nullptr;
  };

  ReadbackPool() = default;
  ReadbackPool(const ReadbackPool&) = delete;
  ReadbackPool& operator=(const ReadbackPool&) = delete;

  std::unique_ptr<HostReadback> read(const std::vector<const float*>& device_scalars);
  void release(Slot* slot);

 private:
  Slot* acquire();

  std::mutex mutex_;
  std::vector<std::unique_ptr<Slot>> slots_;  // every slot ever made
  std::vector<Slot*> free_;
};

}  // namespace belay
