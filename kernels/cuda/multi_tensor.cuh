// Many tensors per launch, as kernel parameters: no descriptor table is copied to the
// device (that copy would need pinned memory or a host wait). A batch holds up to
// kMaxTensors tensors and the prefix sum of their block counts; block b serves the tensor
// whose block range holds b, on a chunk of kChunk elements. More tensors: more launches.
#pragma once
#include <cstdint>
#include <vector>

namespace belay::cuda {

constexpr int kMaxTensors = 32;
constexpr int64_t kChunk = 16384;  // elements per block: 8 passes of 256 threads x 8 elements

template <class Ref>
struct MultiTensorBatch {
  Ref refs[kMaxTensors];
  int64_t block_start[kMaxTensors + 1];
  int count;
};

// What block `block` of a batch works on: its tensor and the element range [start, end) of
// its chunk (the last chunk of a tensor may be short).
template <class Ref>
struct BlockChunk {
  Ref ref;
  int64_t start, end;
};
template <class Ref>
__device__ __forceinline__ BlockChunk<Ref> block_chunk(const MultiTensorBatch<Ref>& batch, int64_t block) {
  int t = 0;
  while (t + 1 < batch.count && block >= batch.block_start[t + 1]) ++t;
  const Ref& r = batch.refs[t];
  const int64_t start = (block - batch.block_start[t]) * kChunk;
  return {r, start, start + kChunk < r.n ? start + kChunk : r.n};
}

// Splits refs (each with a field n) into batches; calls launch(batch, total_blocks) for each.
// Tensors with no elements take no block.
template <class Ref, class Launch>
void for_each_batch(const std::vector<Ref>& refs, Launch&& launch) {
  MultiTensorBatch<Ref> batch{};
  int64_t blocks = 0;
  for (const Ref& r : refs) {
    if (r.n == 0) continue;
    batch.refs[batch.count] = r;
    batch.block_start[batch.count] = blocks;
    blocks += (r.n + kChunk - 1) / kChunk;
    ++batch.count;
    if (batch.count == kMaxTensors) {
      batch.block_start[batch.count] = blocks;
      launch(batch, blocks);
      batch = MultiTensorBatch<Ref>{};
      blocks = 0;
    }
  }
  if (batch.count > 0) {
    batch.block_start[batch.count] = blocks;
    launch(batch, blocks);
  }
}

}  // namespace belay::cuda
