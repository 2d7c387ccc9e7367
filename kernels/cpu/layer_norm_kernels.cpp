// The CPU backend's LayerNorm, forward and backward (kernels/cpu/cpu_kernels.h): a row at a time
// on the active ISA path (kernels/cpu/isa/element_blocks.cpp); dweight and dbias summed over
// fixed chunks of rows, the same bits at any thread count.
#include <cstring>

#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

namespace {

// A LayerNorm parameter as FP32 (ones or zeros when absent): read once per call.
std::vector<float> ln_param(const Tensor* p, int64_t cols, float absent) {
  std::vector<float> v(static_cast<size_t>(cols), absent);
  if (p)
    for (int64_t c = 0; c < cols; ++c) v[c] = load_as_f32(p->data(), p->dtype(), static_cast<size_t>(c));
  return v;
}

// LayerNorm's backward sums dweight and dbias over chunks of this many rows (each in double,
// rows in order), then the chunks in order: the same bits at any thread count.
constexpr int64_t kNormRowChunk = 32;

// A row as FP32 in the thread's row buffer, copied there even when the tensor is FP32. The
// backward's row kernel reads x and dy in two loops (the sums, whose adds wait on each other,
// then dx with dweight and dbias) and writes dx between its reads of the dweight and dbias
// rows: on rows read and written in place the loads and the stores' cache misses stalled those
// loops ([8192, 768] FP32, AMX Xeon, 1 thread: 9.7-10.4 ms in place, with the rows asked for
// two ahead by software prefetch; 5.7-6.2 ms through the buffers, which need no prefetch:
// a copy is one stream the hardware follows). The forward, whose row kernel reads x twice and
// writes y once, ran slower through the buffers (2.2-2.3 -> 3.0-3.2 ms): it stays in place.
inline const float* row_in_buffer(const void* base, DType dtype, int64_t i0, int64_t len, float* buf) {
  if (dtype != DType::F32) return load_block(base, dtype, i0, len, buf);
  std::memcpy(buf, static_cast<const float*>(base) + i0, static_cast<size_t>(len) * sizeof(float));
  return buf;
}

}  // namespace

// Per row (kernels/cpu/isa, the active path): reads x twice (from a row buffer once widened),
// writes y once; ~7 flops per element.
void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                Tensor& rstd) {
  const int64_t cols = x.dim(x.rank() - 1), rows = x.numel() / cols;
  const std::vector<float> w = ln_param(weight, cols, 1.0f), b = ln_param(bias, cols, 0.0f);
  const void* px = x.data();
  void* py = y.data();
  const DType tx = x.dtype(), ty = y.dtype();
  float *pm = mean.data_as<float>(), *pr = rstd.data_as<float>();
  const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (x.numel() > kParallelThreshold)
  {
    std::vector<float> xb(static_cast<size_t>(cols)), yb(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = load_block(px, tx, r * cols, cols, xb.data());
      float* yr = out_block(py, ty, r * cols, yb.data());
      blocks.layer_norm_row(xr, w.data(), b.data(), cols, eps, yr, pm + r, pr + r);
      store_block(py, ty, r * cols, cols, yr);
    }
  }
}

// Reads x and dy once, writes dx once (~12 flops per element); then sums the chunks'
// dweight and dbias (rows / 32 x cols doubles each) in chunk order.
void layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                         bool accumulate) {
  const int64_t cols = x.dim(x.rank() - 1), rows = x.numel() / cols;
  const std::vector<float> w = ln_param(weight, cols, 1.0f);
  const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
  std::vector<double> pw(static_cast<size_t>(chunks * cols), 0.0), pb(static_cast<size_t>(chunks * cols), 0.0);
  const void *px = x.data(), *pg = dy.data();
  void* pd = dx.data();
  const DType tx = x.dtype(), tg = dy.dtype(), td = dx.dtype();
  const float *pm = mean.data_as<const float>(), *pr = rstd.data_as<const float>();
  const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (x.numel() > kParallelThreshold)
  {
    std::vector<float> xb(static_cast<size_t>(cols)), gb(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch)
      for (int64_t r = ch * kNormRowChunk; r < std::min(rows, (ch + 1) * kNormRowChunk); ++r) {
        const float* xr = row_in_buffer(px, tx, r * cols, cols, xb.data());
        const float* gr = row_in_buffer(pg, tg, r * cols, cols, gb.data());
        float* dr = db.data();  // then stored (store_block: copied, or rounded once)
        blocks.layer_norm_row_backward(xr, gr, w.data(), cols, pm[r], pr[r], dr, &pw[ch * cols], &pb[ch * cols]);
        store_block(pd, td, r * cols, cols, dr);
      }
  }
  for (auto [out, part] : {std::pair{dweight, &pw}, std::pair{dbias, &pb}}) {
    if (!out) continue;
    float* po = out->data_as<float>();
    const double* p = part->data();
    parallel_for(cols, [&](int64_t c) {
      double s = 0.0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += p[ch * cols + c];
      po[c] = accumulate ? po[c] + static_cast<float>(s) : static_cast<float>(s);
    });
  }
}

}  // namespace belay::cpu
