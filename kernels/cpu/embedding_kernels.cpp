// The CPU backend's embedding, forward and backward (kernels/cpu/cpu_kernels.h): rows copied,
// and added back into the table in a fixed order (no float atomics).
#include <cmath>
#include <string>

#include "engine/error.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace belay::cpu {

namespace {

// The ids of an embedding as row indices, each checked to be an integer in [0, rows): a bad
// id is bad input (UsageError), named with its position.
std::vector<int64_t> read_ids(const char* op, const Tensor& ids, int64_t rows) {
  std::vector<int64_t> out(static_cast<size_t>(ids.numel()));
  const float* p = ids.data_as<const float>();
  for (size_t i = 0; i < out.size(); ++i) {
    const float v = p[i];
    if (!(v >= 0.0f) || v >= static_cast<float>(rows) || v != std::floor(v))
      throw UsageError(std::string(op) + ": id " + std::to_string(v) + " at position " + std::to_string(i) +
                  " is not a row of the table (an integer in [0, " + std::to_string(rows) + "))");
    out[i] = static_cast<int64_t>(v);
  }
  return out;
}

}  // namespace

// Reads N ids and N x D table elements, writes N x D: a copy of each row, no flops.
void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const std::vector<int64_t> idx = read_ids("embedding", ids, table.dim(0));
  const size_t row_bytes = static_cast<size_t>(table.dim(1)) * dtype_size(table.dtype());
  const char* src = static_cast<const char*>(table.data());
  char* dst = static_cast<char*>(out.data());
  parallel_for(static_cast<int64_t>(idx.size()), [&](int64_t r) {
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes, src + static_cast<size_t>(idx[r]) * row_bytes, row_bytes);
  });
}

// Reads dout once (N x D) and writes the touched table rows; one add per element. The ids
// are bucketed by row with a counting sort (stable: each bucket lists its positions in
// order), then each touched row is owned by one thread, which adds its rows in that order.
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable) {
  const int64_t vocab = dtable.dim(0), dim = dtable.dim(1), n = ids.numel();
  const std::vector<int64_t> idx = read_ids("embedding_backward", ids, vocab);
  std::vector<int64_t> start(static_cast<size_t>(vocab) + 1, 0), order(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) ++start[static_cast<size_t>(idx[r]) + 1];
  for (int64_t v = 0; v < vocab; ++v) start[v + 1] += start[v];
  std::vector<int64_t> fill(start.begin(), start.end() - 1), touched;
  for (int64_t r = 0; r < n; ++r) order[static_cast<size_t>(fill[static_cast<size_t>(idx[r])]++)] = r;
  for (int64_t v = 0; v < vocab; ++v)
    if (start[v + 1] > start[v]) touched.push_back(v);
  const void* pg = dout.data();
  const DType dout_dtype = dout.dtype();
  float* table = dtable.data_as<float>();
  const int64_t rows = static_cast<int64_t>(touched.size());
#pragma omp parallel if (n * dim > kParallelThreshold)
  {
    std::vector<float> buf(static_cast<size_t>(dim));
#pragma omp for schedule(static)
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t v = touched[k];
      float* dst = table + v * dim;
      for (int64_t i = start[v]; i < start[v + 1]; ++i) {
        const float* g = load_block(pg, dout_dtype, order[i] * dim, dim, buf.data());
        for (int64_t c = 0; c < dim; ++c) dst[c] += g[c];
      }
    }
  }
}

}  // namespace belay::cpu
