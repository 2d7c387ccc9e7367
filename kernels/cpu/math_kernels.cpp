// The Var operators' ops of the CPU backend (kernels/cpu/cpu_kernels.h): the elementwise
// functions of UnaryOp and the axis ops, maps over blocks (block_loops.h); sum_axis and the
// copies (transpose, swap_axes) loops of their own.
#include "kernels/common/element_math.h"
#include "kernels/common/unary_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace belay::cpu {

// The functions of UnaryOp, a block at a time through the shared formula (one code path
// for every ISA: the same bits whichever is active). Reads x, writes y; ~20 flops (a libm call).
void unary(UnaryOp op, float p, const Tensor& x, Tensor& y) {
  map_blocks(
      y, [op, p](int64_t, int64_t len, float* r, const float* v) {
        for (int64_t j = 0; j < len; ++j) r[j] = unary_f32(op, v[j], p);
      },
      x);
}

// Reads x, y and dy, writes dx.
void unary_backward(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  map_blocks(
      dx,
      [op, p](int64_t, int64_t len, float* r, const float* v, const float* w, const float* g) {
        for (int64_t j = 0; j < len; ++j) r[j] = unary_grad_f32(op, v[j], w[j], g[j], p);
      },
      x, y, dy);
}

// Reads a and out once, b (small, widened to FP32 once) from cache; 1 flop per element.
void binary_broadcast(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                      Tensor& out) {
  const std::vector<float> bf = b.to_vector();
  map_blocks(
      out,
      [&](int64_t i0, int64_t len, float* r, const float* x) {
        // (o, l, i) of element i0, then stepped along: no division per element.
        int64_t i = i0 % view.inner, l = i0 / view.inner % view.len, o = i0 / (view.inner * view.len);
        for (int64_t j = 0; j < len; ++j) {
          const float y = bf[static_cast<size_t>(o * view.inner + i)];
          r[j] = swapped ? binary_f32(op, y, x[j]) : binary_f32(op, x[j], y);
          if (++i == view.inner) {
            i = 0;
            if (++l == view.len) l = 0, ++o;
          }
        }
      },
      a);
}

void broadcast_axis(const Tensor& g, const AxisView& view, float alpha, Tensor& out) {
  const void* pg = g.data();
  const DType g_dtype = g.dtype();
  map_blocks(out, [&](int64_t i0, int64_t len, float* r) {
    for (int64_t j = 0; j < len; ++j)
      r[j] = alpha * load_as_f32(pg, g_dtype, static_cast<size_t>(view.reduced_index(i0 + j)));
  });
}

// Reads x once, writes outer * inner values. As sum_rows: each output sums its l in order in
// double; l is walked outer and a block of kCols outputs inner, so the reads are contiguous.
void sum_axis(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) {
  const void* px = x.data();
  void* po = out.data();
  const DType x_dtype = x.dtype(), out_dtype = out.dtype();
  if (view.inner == 1) {  // the last axis: each output sums a contiguous run, a block at a time
    parallel_for(view.outer, [&](int64_t o) {
      double acc = 0.0;
      alignas(64) float buf[kBlock];
      for (int64_t l0 = 0; l0 < view.len; l0 += kBlock) {
        const int64_t len = std::min(kBlock, view.len - l0);
        const float* v = load_block(px, x_dtype, o * view.len + l0, len, buf);
        for (int64_t j = 0; j < len; ++j) acc += v[j];
      }
      const float s = static_cast<float>(acc * static_cast<double>(alpha));
      store_from_f32(po, out_dtype, static_cast<size_t>(o), accumulate ? load_as_f32(po, out_dtype, static_cast<size_t>(o)) + s : s);
    });
    return;
  }
  constexpr int64_t kCols = 256;
  const int64_t col_blocks = (view.inner + kCols - 1) / kCols, tasks = view.outer * col_blocks;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / col_blocks, c0 = t % col_blocks * kCols, len = std::min(kCols, view.inner - c0);
    double acc[kCols] = {};
    alignas(64) float buf[kCols];
    for (int64_t l = 0; l < view.len; ++l) {
      const float* v = load_block(px, x_dtype, (o * view.len + l) * view.inner + c0, len, buf);
      for (int64_t j = 0; j < len; ++j) acc[j] += v[j];
    }
    for (int64_t j = 0; j < len; ++j) {
      const size_t k = static_cast<size_t>(o * view.inner + c0 + j);
      const float s = static_cast<float>(acc[j] * static_cast<double>(alpha));
      store_from_f32(po, out_dtype, k, accumulate ? load_as_f32(po, out_dtype, k) + s : s);
    }
  }
}

// Moves 2 x numel x dtype bytes; tiles of 32 x 32 keep both sides' lines in cache.
void transpose(const Tensor& x, Tensor& out) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const size_t es = dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.data());
  char* po = static_cast<char*>(out.data());
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  parallel_for(row_tiles, [&](int64_t rt) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = rt * kTile; r < std::min(rows, rt * kTile + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          std::memcpy(po + (c * rows + r) * es, px + (r * cols + c) * es, es);
  });
}

// Moves 2 x numel x dtype bytes: each (outer, j, m, i) row of `inner` elements is one
// contiguous copy (a head's d values when splitting heads).
void swap_axes(const Tensor& x, const SwapAxesView& v, Tensor& out) {
  const size_t row = static_cast<size_t>(v.inner) * dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.data());
  char* po = static_cast<char*>(out.data());
  parallel_for(v.outer * v.q, [&](int64_t oj) {  // out [outer, q, mid, p, inner]
    const int64_t o = oj / v.q, j = oj % v.q;
    for (int64_t m = 0; m < v.mid; ++m)
      for (int64_t i = 0; i < v.p; ++i) {
        const int64_t src = (((o * v.p + i) * v.mid + m) * v.q + j);
        const int64_t dst = (((o * v.q + j) * v.mid + m) * v.p + i);
        std::memcpy(po + dst * row, px + src * row, row);
      }
  });
}

}  // namespace belay::cpu
