// The pinned pools of pinned_transfers.h. All CUDA work is enqueued on the default stream,
// where every kernel of the backend runs, so stream order alone makes an upload land before
// the kernels that read it and a snapshot be taken after the kernels that computed it.
#include "kernels/cuda/pinned_transfers.h"

#include <cstring>
#include <string>

#include "engine/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace belay {
namespace {

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  // No timing: such an event is cheaper to record and to query, and only completion matters.
  BELAY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// Whether the work before `e` has run; never blocks. cudaErrorNotReady only means "not yet":
// it must not stay behind as the thread's last error, which after_launch() would take for a
// failed launch, so it is cleared here (and only it: any other last error is left alone).
bool event_done(cudaEvent_t e) {
  const cudaError_t state = cudaEventQuery(e);
  if (state == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  BELAY_CUDA_CHECK(state);
  return true;
}

// Capacities grow in powers of two from 64 KiB, so uploads of slowly varying sizes (the last,
// shorter batch of an epoch, then a full one) do not reallocate each time.
size_t staging_capacity(size_t bytes) {
  size_t c = size_t{64} << 10;
  while (c < bytes) c *= 2;
  return c;
}

}  // namespace

// ---- uploads

UploadStaging::Buffer& UploadStaging::take(size_t bytes) {
  if (buffers_.empty()) buffers_.push_back({nullptr, 0, new_event()});  // lazily: no CUDA call before a first upload
  size_t i = next_ % buffers_.size();
  // An event never recorded counts as complete, so a fresh buffer is free at once.
  if (!event_done(buffers_[i].done)) {
    if (buffers_.size() < kMaxBuffers) {
      // The oldest copy has not run yet (the GPU is busy with earlier work): rather than
      // wait for it, add a buffer here; the oldest stays next in line.
      buffers_.insert(buffers_.begin() + static_cast<std::ptrdiff_t>(i), Buffer{nullptr, 0, new_event()});
    } else {
      // The host is kMaxBuffers uploads ahead of the GPU: wait for the oldest only.
      BELAY_CUDA_CHECK(cudaEventSynchronize(buffers_[i].done));
    }
  }
  next_ = i + 1;
  Buffer& b = buffers_[i];
  if (b.capacity < bytes) {
    // Its last copy has completed (above), so the old buffer may go.
    if (b.host) BELAY_CUDA_CHECK(cudaFreeHost(b.host));
    b.host = nullptr;
    b.capacity = 0;
    const size_t capacity = staging_capacity(bytes);
    BELAY_CUDA_CHECK(cudaMallocHost(&b.host, capacity));
    b.capacity = capacity;
  }
  return b;
}

void UploadStaging::upload(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kMaxStagedBytes) {
    // Returns once the source has been consumed, so the caller may reuse it after too.
    BELAY_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Buffer& b = take(bytes);
  std::memcpy(b.host, host_src, bytes);
  // From pinned memory the copy is a true DMA: enqueued behind the work already queued,
  // and the host goes on at once.
  BELAY_CUDA_CHECK(cudaMemcpyAsync(device_dst, b.host, bytes, cudaMemcpyHostToDevice, nullptr));
  BELAY_CUDA_CHECK(cudaEventRecord(b.done, nullptr));
}

// ---- readbacks

namespace {

class CudaReadback final : public HostReadback {
 public:
  CudaReadback(ReadbackPool* pool, ReadbackPool::Slot* slot, size_t count)
      : pool_(pool), slot_(slot), count_(count) {}
  CudaReadback(const CudaReadback&) = delete;
  CudaReadback& operator=(const CudaReadback&) = delete;

  ~CudaReadback() override {
    // The gather kernel may still be about to write the slot: it goes back to the pool only
    // once that has happened, so a later readback never sees this one's values land late.
    // A destructor cannot throw; an error here means the context is lost and nothing will
    // write the slot again.
    if (!waited_) cudaEventSynchronize(slot_->done);
    pool_->release(slot_);
  }

  bool ready() const override {
    return waited_ || event_done(slot_->done);
  }

  const std::vector<float>& wait() override {
    if (!waited_) {
      BELAY_CUDA_CHECK(cudaEventSynchronize(slot_->done));
      values_.assign(slot_->host, slot_->host + count_);
      waited_ = true;
    }
    return values_;
  }

 private:
  ReadbackPool* pool_;
  ReadbackPool::Slot* slot_;
  size_t count_;
  bool waited_ = false;
  std::vector<float> values_;
};

}  // namespace

ReadbackPool::Slot* ReadbackPool::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!free_.empty()) {
    Slot* s = free_.back();
    free_.pop_back();
    return s;
  }
  auto slot = std::make_unique<Slot>();
  BELAY_CUDA_CHECK(cudaMallocHost(&slot->host, kMaxReadbackScalars * sizeof(float)));
  // With unified addressing this is the host pointer itself; asking keeps it right where not.
  void* device = nullptr;
  BELAY_CUDA_CHECK(cudaHostGetDevicePointer(&device, slot->host, 0));
  slot->device = static_cast<float*>(device);
  slot->done = new_event();
  slots_.push_back(std::move(slot));
  return slots_.back().get();
}

void ReadbackPool::release(Slot* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(slot);
}

std::unique_ptr<HostReadback> ReadbackPool::read(const std::vector<const float*>& device_scalars) {
  if (device_scalars.size() > static_cast<size_t>(kMaxReadbackScalars))
    throw Error("read_async: " + std::to_string(device_scalars.size()) + " scalars given, at most " +
                std::to_string(kMaxReadbackScalars) + " per call; split them over several calls");
  Slot* slot = acquire();
  // The readback owns the slot from here on, so an error below still returns it to the pool
  // (an event not yet recorded counts as complete: its destructor does not wait).
  auto readback = std::make_unique<CudaReadback>(this, slot, device_scalars.size());
  if (!device_scalars.empty()) {
    launch_readback_gather(device_scalars.data(), static_cast<int>(device_scalars.size()), slot->device);
    BELAY_CUDA_CHECK(cudaGetLastError());
  }
  BELAY_CUDA_CHECK(cudaEventRecord(slot->done, nullptr));
  return readback;
}

}  // namespace belay
