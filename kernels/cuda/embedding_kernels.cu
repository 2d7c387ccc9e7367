// Embedding on the GPU: the forward gathers table rows (a copy, bit for bit); the backward
// adds the rows of dout into the FP32 table gradient with the bits of the sequential loop
// `for r in order: dtable[ids[r]] += dout[r]` (engine/backend.h), on every scheduler seed and
// with no float atomics. It does so in two kernels: one block buckets the positions by id
// with a stable counting sort (bucket v lists the positions holding v in increasing order),
// then one block per touched table row adds its bucket's dout rows in that order, a thread
// per column.
// An id is a row index held as a float (as cross_entropy's labels). One that is not an
// integer in [0, V) cannot be an Error here without the host reading the ids (the backend
// never reads device memory on the host), so as with cross_entropy it poisons what it
// touches: its output row is NaN (the loss goes non-finite, the step is skipped, anomaly mode
// names the op), and the backward leaves it out.
// Bytes: forward reads N ids and N x D table elements, writes N x D; no flops. Backward:
// the buckets read N ids, write 2V + N ints; the sums read N x D dout elements and the N
// positions, read and write the touched table rows; one add per dout element.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/simt_seam.cuh"
#include "kernels/cuda/device_access.cuh"
#include "kernels/cuda/row_grid.h"

namespace belay {
namespace {

using cuda::kBlock;
using cuda::load_f32;
using cuda::row_blocks;

// The row an id names, or -1 when it is not an integer in [0, vocab) (NaN included).
__device__ __forceinline__ int64_t row_of(float id, int64_t vocab) {
  return id >= 0.0f && id < static_cast<float>(vocab) && id == floorf(id) ? static_cast<int64_t>(id) : -1;
}

template <class Bits>
__global__ void embedding_kernel(const Bits* table, const float* ids, int64_t n, int64_t vocab, int64_t dim,
                                 Bits nan_bits, Bits* out) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t row = row_of(ids[r], vocab);
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out[r * dim + c] = row >= 0 ? table[row * dim + c] : nan_bits;
  }
}

// The positions [base, base + blockDim.x) of ids, one a thread: this thread's row (-1 if
// none), how many threads before it in the chunk hold the same row (its rank), and whether
// it is the chunk's last holder of that row. O(blockDim.x) per thread, a chunk at a time.
struct ChunkSlot {
  int64_t row;
  int rank;
  bool last;
};
__device__ ChunkSlot chunk_slot(const float* ids, int64_t n, int64_t vocab, int64_t base, int* rows) {
  const int64_t r = base + threadIdx.x;
  const int row = r < n ? static_cast<int>(row_of(ids[r], vocab)) : -1;
  rows[threadIdx.x] = row;
  __syncthreads();
  ChunkSlot s{row, 0, true};
  if (row >= 0)
    for (unsigned j = 0; j < blockDim.x; ++j) {
      if (j < threadIdx.x) s.rank += rows[j] == row;
      if (j > threadIdx.x && rows[j] == row) s.last = false;
    }
  return s;
}

// One block. start[v] = where bucket v begins in order (start[vocab] = the valid ids), and
// order[start[v] + k] = the k-th position (in increasing order) whose id is v. fill: vocab
// ints of scratch. Chunks of blockDim.x positions are taken in order; within a chunk the
// ranks keep positions in order, and only the chunk's last holder of a row moves its count,
// after every thread has read it: no atomics, the same result on every schedule.
__global__ void embedding_buckets_kernel(const float* ids, int64_t n, int64_t vocab, int32_t* start, int32_t* fill,
                                         int32_t* order) {
  BELAY_SHARED(int, rows, [kBlock]);
  BELAY_SHARED(int32_t, seg_total, [kBlock]);
  for (int64_t v = threadIdx.x; v <= vocab; v += blockDim.x) start[v] = 0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += blockDim.x) {  // counts: start[v + 1] = how many ids are v
    const ChunkSlot s = chunk_slot(ids, n, vocab, base, rows);
    if (s.row >= 0 && s.last) start[s.row + 1] += s.rank + 1;
    __syncthreads();  // rows[] is rewritten by the next chunk
  }
  // Inclusive scan of start[1..vocab]: each thread a contiguous segment, then the segments'
  // totals scanned by thread 0 in order.
  const int64_t seg = (vocab + blockDim.x - 1) / blockDim.x, lo = 1 + threadIdx.x * seg;
  const int64_t hi = lo + seg < vocab + 1 ? lo + seg : vocab + 1;
  int32_t total = 0;
  for (int64_t v = lo; v < hi; ++v) total += start[v];
  seg_total[threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.x == 0)
    for (unsigned t = 1; t < blockDim.x; ++t) seg_total[t] += seg_total[t - 1];
  __syncthreads();
  int32_t run = threadIdx.x > 0 ? seg_total[threadIdx.x - 1] : 0;
  for (int64_t v = lo; v < hi; ++v) start[v] = run += start[v];
  __syncthreads();
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) fill[v] = start[v];
  __syncthreads();
  for (int64_t base = 0; base < n; base += blockDim.x) {  // stable scatter of the positions
    const ChunkSlot s = chunk_slot(ids, n, vocab, base, rows);
    if (s.row >= 0) order[fill[s.row] + s.rank] = static_cast<int32_t>(base + threadIdx.x);
    __syncthreads();  // every thread has read fill[] before the last holders move it
    if (s.row >= 0 && s.last) fill[s.row] += s.rank + 1;
    __syncthreads();
  }
}

// One block per table row v (grid-stride), a thread per column: dtable[v, c] += the rows of
// bucket v, in position order, in FP32: the sequential loop's additions, in its order.
__global__ void embedding_backward_kernel(const void* dout, DType dout_dtype, const int32_t* start,
                                          const int32_t* order, int64_t vocab, int64_t dim, float* dtable) {
  for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
    const int32_t begin = start[v], end = start[v + 1];
    if (begin == end) continue;  // the whole block skips an untouched row
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float acc = dtable[v * dim + c];
      for (int32_t i = begin; i < end; ++i) acc += load_f32(dout, dout_dtype, static_cast<int64_t>(order[i]) * dim + c);
      dtable[v * dim + c] = acc;
    }
  }
}

}  // namespace

void launch_embedding(const void* table, DType table_dtype, const float* ids, int64_t n, int64_t vocab, int64_t dim,
                      void* out) {
  if (n <= 0 || dim <= 0) return;
  if (table_dtype == DType::F32)
    cuda::launch<embedding_kernel<uint32_t>>(row_blocks(n), kBlock, 0, nullptr, static_cast<const uint32_t*>(table),
                                             ids, n, vocab, dim, uint32_t{0x7fc00000u}, static_cast<uint32_t*>(out));
  else
    cuda::launch<embedding_kernel<uint16_t>>(
        row_blocks(n), kBlock, 0, nullptr, static_cast<const uint16_t*>(table), ids, n, vocab, dim,
        table_dtype == DType::F16 ? uint16_t{0x7e00u} : uint16_t{0x7fc0u}, static_cast<uint16_t*>(out));
}

void launch_embedding_backward(const void* dout, DType dout_dtype, const float* ids, int64_t n, int64_t vocab,
                               int64_t dim, int32_t* scratch, float* dtable) {
  if (n <= 0 || dim <= 0 || vocab <= 0) return;
  int32_t* start = scratch;            // vocab + 1
  int32_t* fill = start + vocab + 1;   // vocab
  int32_t* order = fill + vocab;       // n
  cuda::launch<embedding_buckets_kernel>(1, kBlock, 0, nullptr, ids, n, vocab, start, fill, order);
  cuda::launch<embedding_backward_kernel>(row_blocks(vocab), kBlock, 0, nullptr, dout, dout_dtype, start, order, vocab,
                                          dim, dtable);
}

}  // namespace belay
