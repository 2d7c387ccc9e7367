#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/error.h"
#include "kernels/common/element_math.h"
#include "kernels/common/unary_math.h"
#include "kernels/cpu/cpu_convert.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/isa/element_blocks.h"


// How the loops are shaped, so they vectorize: the dtype is resolved once per call (a
// template parameter or a block conversion), never per element; elementwise kernels work on
// blocks of kBlock elements converted to FP32 in a stack buffer (in L1), computed by a
// plain loop over float pointers, and converted back. Results are the same bits as the
// element-at-a-time formulation: the same functions of kernels/common, in the same order.

namespace belay {
namespace {

// Loops shorter than this run on one thread: forking costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;
// Reductions sum fixed chunks in double, then the chunk sums in order: the result does not
// depend on the thread count, so a run repeats bit for bit.
constexpr int64_t kReduceChunk = 1 << 14;
// Chunks summed side by side by one thread: each keeps its own sequential order (so the
// bits do not change), and the independent additions hide the FP add latency.
constexpr int64_t kReduceLanes = 8;
// Elementwise block: 4 KiB of FP32 per operand.
constexpr int64_t kBlock = 1024;

void* host_alloc(size_t bytes) {
  // 64-byte alignment for vector loads; round the size up as aligned_alloc requires.
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}
void host_free(void* p) { std::free(p); }

template <class F>
void parallel_for(int64_t n, F&& f) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// f(i0, len) on consecutive blocks covering [0, n).
template <class F>
void parallel_blocks(int64_t n, F&& f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}

// Elements [i0, i0 + len) of a tensor as FP32: a pointer into it when it is FP32, else
// converted into buf.
const float* load_block(const void* base, DType dt, int64_t i0, int64_t len, float* buf) {
  switch (dt) {
    case DType::F16: cvt_f16_to_f32(static_cast<const uint16_t*>(base) + i0, buf, len); return buf;
    case DType::BF16: cvt_bf16_to_f32(static_cast<const uint16_t*>(base) + i0, buf, len); return buf;
    default: return static_cast<const float*>(base) + i0;
  }
}
// Where a block's FP32 results go: straight into an FP32 tensor, else buf (see store_block).
float* out_block(void* base, DType dt, int64_t i0, float* buf) {
  return dt == DType::F32 ? static_cast<float*>(base) + i0 : buf;
}
// Writes FP32 values to elements [i0, i0 + len), rounding once into the tensor's dtype.
void store_block(void* base, DType dt, int64_t i0, int64_t len, const float* vals) {
  switch (dt) {
    case DType::F16: cvt_f32_to_f16(vals, static_cast<uint16_t*>(base) + i0, len); break;
    case DType::BF16: cvt_f32_to_bf16(vals, static_cast<uint16_t*>(base) + i0, len); break;
    default:
      if (static_cast<float*>(base) + i0 != vals) std::memcpy(static_cast<float*>(base) + i0, vals, len * 4);
  }
}

// One element as FP32, the dtype a compile-time constant (for the reductions).
template <DType D>
inline float ld(const void* base, int64_t i) {
  if constexpr (D == DType::F16) return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  else if constexpr (D == DType::BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  else return static_cast<const float*>(base)[i];
}

template <DType D>
struct DTypeTag {
  static constexpr DType value = D;
};
// f(DTypeTag<D>{}) with D the runtime dtype: one instantiation per dtype.
template <class F>
decltype(auto) with_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F16: return f(DTypeTag<DType::F16>{});
    case DType::BF16: return f(DTypeTag<DType::BF16>{});
    default: return f(DTypeTag<DType::F32>{});
  }
}

// Sum of f(i) for i in [0, n), deterministic whatever the number of threads: chunk c sums
// its elements in index order in double, the chunk sums are added in chunk order. A thread
// works on kReduceLanes chunks at once, each with its own accumulator.
// `group(base, out)` sums the kReduceLanes whole chunks starting at element `base` into
// out[0..kReduceLanes) (deterministic_sum below: f element by element; the guard: the
// element kernel of the active ISA, same order, same bits).
template <class F, class Group>
double deterministic_sum_grouped(int64_t n, F&& f, Group&& group) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  const int64_t full = n / kReduceChunk;  // chunks of exactly kReduceChunk elements
  const int64_t groups = (chunks + kReduceLanes - 1) / kReduceLanes;
  thread_local std::vector<double> partial;
  partial.assign(static_cast<size_t>(chunks), 0.0);
  double* out = partial.data();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t grp = 0; grp < groups; ++grp) {
    const int64_t c0 = grp * kReduceLanes;
    if (c0 + kReduceLanes <= full) {
      group(c0 * kReduceChunk, out + c0);
    } else {
      for (int64_t c = c0; c < std::min(chunks, c0 + kReduceLanes); ++c) {
        double s = 0.0;
        const int64_t end = std::min(n, (c + 1) * kReduceChunk);
        for (int64_t i = c * kReduceChunk; i < end; ++i) s += f(i);
        out[c] = s;
      }
    }
  }
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += out[c];
  return total;
}

template <class F>
double deterministic_sum(int64_t n, F&& f) {
  return deterministic_sum_grouped(n, f, [&](int64_t base, double* out) {
    double acc[kReduceLanes] = {};
    for (int64_t j = 0; j < kReduceChunk; ++j)
      for (int64_t k = 0; k < kReduceLanes; ++k) acc[k] += f(base + k * kReduceChunk + j);
    for (int64_t k = 0; k < kReduceLanes; ++k) out[k] = acc[k];
  });
}

// AdamW's numbers for one step as the block loops use them: the hyper-parameters, and the
// lr and bias corrections read from the step's device scalars.
struct AdamWStep {
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2;
};

// The value of a one-element FP32 tensor of this backend. CPU "device memory" is host
// memory, so a kernel reads it directly (not through Tensor::item, which counts host reads).
float scalar_value(const Tensor& t) { return t.data_as<const float>()[0]; }

// Tensors at least this large get their FP16 working copy written with non-temporal stores.
constexpr int64_t kStreamThreshold = 1 << 20;

// The AdamW update of one block on the active ISA path (kernels/cpu/isa/element_blocks.cpp:
// the same operations in the same order on every path, so the same bits). Returns whether it
// also wrote the working copy (FP16 on the F16C paths); else the caller does.
bool adamw_block(const float* g, float* p, float* m, float* v, void* w, DType dw, int64_t len, float inv, float coef,
                 const AdamWStep& h, float wd, bool stream) {
  const AdamWBlock b{g,     p,       m,       v,      w && dw == DType::F16 ? static_cast<uint16_t*>(w) : nullptr,
                     len,   inv,     coef,    h.lr,   h.beta1,
                     h.beta2, h.eps, h.bias_correction1, h.bias_correction2, wd, stream};
  return cpu_element_blocks().adamw(b);
}


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

class ReadyReadback final : public HostReadback {
 public:
  explicit ReadyReadback(std::vector<float> values) : values_(std::move(values)) {}
  bool ready() const override { return true; }
  const std::vector<float>& wait() override { return values_; }

 private:
  std::vector<float> values_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(DeviceKind::CPU) {}
  std::string name() const override { return "cpu"; }
  RawMemory raw_memory() const override { return {host_alloc, host_free}; }

  void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) const override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize() const override {}

  // Moves (src + dst) bytes per element.
  void cast_impl(const Tensor& src, Tensor& dst) const override {
    if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;
    if (src.dtype() == dst.dtype()) {
      std::memmove(dst.data(), src.data(), src.nbytes());
      return;
    }
    const void* s = src.data();
    void* d = dst.data();
    const DType sd = src.dtype(), dd = dst.dtype();
    parallel_blocks(src.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float buf[kBlock];
      store_block(d, dd, i0, len, load_block(s, sd, i0, len, buf));
    });
  }

  void fill_impl(Tensor& t, float value) const override {
    const int64_t n = t.numel();
    if (t.dtype() == DType::F32) {
      float* p = t.data_as<float>();
      parallel_blocks(n, [&](int64_t i0, int64_t len) { std::fill(p + i0, p + i0 + len, value); });
      return;
    }
    const uint16_t bits = t.dtype() == DType::F16 ? f32_to_f16_bits(value) : f32_to_bf16_bits(value);
    uint16_t* p = t.data_as<uint16_t>();
    parallel_blocks(n, [&](int64_t i0, int64_t len) { std::fill(p + i0, p + i0 + len, bits); });
  }

  // Elementwise kernels below: read each input once, write the output once; 1 flop or so.
  void binary_impl(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) const override {
    const void *pa = a.data(), *pb = b.data();
    void* po = out.data();
    const DType da = a.dtype(), db = b.dtype(), dout = out.dtype();
    parallel_blocks(a.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float ba[kBlock], bb[kBlock], bo[kBlock];
      const float* x = load_block(pa, da, i0, len, ba);
      const float* y = load_block(pb, db, i0, len, bb);
      float* r = out_block(po, dout, i0, bo);
      switch (op) {
        case BinaryOp::Add: for (int64_t j = 0; j < len; ++j) r[j] = x[j] + y[j]; break;
        case BinaryOp::Sub: for (int64_t j = 0; j < len; ++j) r[j] = x[j] - y[j]; break;
        case BinaryOp::Mul: for (int64_t j = 0; j < len; ++j) r[j] = x[j] * y[j]; break;
        case BinaryOp::Div: for (int64_t j = 0; j < len; ++j) r[j] = x[j] / y[j]; break;
      }
      store_block(po, dout, i0, len, r);
    });
  }

  void scale_impl(const Tensor& x, float s, Tensor& out) const override {
    const void* px = x.data();
    void* po = out.data();
    const DType dx = x.dtype(), dout = out.dtype();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock], bo[kBlock];
      const float* v = load_block(px, dx, i0, len, bx);
      float* r = out_block(po, dout, i0, bo);
      for (int64_t j = 0; j < len; ++j) r[j] = s * v[j];
      store_block(po, dout, i0, len, r);
    });
  }

  void accumulate_impl(Tensor& dst, const Tensor& src, float alpha, const Tensor* s) const override {
    const float factor = alpha * (s ? scalar_value(*s) : 1.0f);
    const void* ps = src.data();
    void* pd = dst.data();
    const DType dsrc = src.dtype(), ddst = dst.dtype();
    parallel_blocks(dst.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bs[kBlock], bd[kBlock];
      const float* x = load_block(ps, dsrc, i0, len, bs);
      const float* d = load_block(pd, ddst, i0, len, bd);
      float* r = out_block(pd, ddst, i0, bd);
      for (int64_t j = 0; j < len; ++j) r[j] = d[j] + factor * x[j];
      store_block(pd, ddst, i0, len, r);
    });
  }

  void broadcast_scalar_impl(const Tensor& s, float alpha, Tensor& out) const override {
    fill_impl(out, scalar_value(s) * alpha);
  }

  void activation_impl(Activation act, const Tensor& x, Tensor& y) const override {
    const void* px = x.data();
    void* py = y.data();
    const DType dx = x.dtype(), dy = y.dtype();
    // The FP32 math of a block on the active ISA path (kernels/cpu/isa/element_blocks.cpp):
    // GELU through belay's own erf (erf_exp.h), the same bits on every path.
    const ElementBlocks& blocks = cpu_element_blocks();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock], bo[kBlock];
      const float* v = load_block(px, dx, i0, len, bx);
      float* r = out_block(py, dy, i0, bo);
      (act == Activation::Relu ? blocks.relu : blocks.gelu)(v, r, len);
      store_block(py, dy, i0, len, r);
    });
  }

  void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const override {
    const void *px = x.data(), *pdy = dy.data();
    void* pdx = dx.data();
    const DType tx = x.dtype(), tdy = dy.dtype(), tdx = dx.dtype();
    const ElementBlocks& blocks = cpu_element_blocks();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock], bg[kBlock], bo[kBlock];
      const float* v = load_block(px, tx, i0, len, bx);
      const float* g = load_block(pdy, tdy, i0, len, bg);
      float* r = out_block(pdx, tdx, i0, bo);
      (act == Activation::Relu ? blocks.relu_grad : blocks.gelu_grad)(v, g, r, len);
      store_block(pdx, tdx, i0, len, r);
    });
  }

  // The functions of UnaryOp, a block at a time through the shared formula (one code path
  // for every ISA: the same bits whichever is active). Reads x, writes y; ~20 flops (a libm call).
  void unary_impl(UnaryOp op, float p, const Tensor& x, Tensor& y) const override {
    const void* px = x.data();
    void* py = y.data();
    const DType dx = x.dtype(), dy = y.dtype();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock], bo[kBlock];
      const float* v = load_block(px, dx, i0, len, bx);
      float* r = out_block(py, dy, i0, bo);
      for (int64_t j = 0; j < len; ++j) r[j] = unary_f32(op, v[j], p);
      store_block(py, dy, i0, len, r);
    });
  }

  // Reads x, y and dy, writes dx.
  void unary_backward_impl(UnaryOp op, float p, const Tensor& x, const Tensor& y, const Tensor& dy,
                           Tensor& dx) const override {
    const void *px = x.data(), *pyv = y.data(), *pdy = dy.data();
    void* pdx = dx.data();
    const DType tx = x.dtype(), ty = y.dtype(), tdy = dy.dtype(), tdx = dx.dtype();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock], by[kBlock], bg[kBlock], bo[kBlock];
      const float* v = load_block(px, tx, i0, len, bx);
      const float* w = load_block(pyv, ty, i0, len, by);
      const float* g = load_block(pdy, tdy, i0, len, bg);
      float* r = out_block(pdx, tdx, i0, bo);
      for (int64_t j = 0; j < len; ++j) r[j] = unary_grad_f32(op, v[j], w[j], g[j], p);
      store_block(pdx, tdx, i0, len, r);
    });
  }

  // Reads a and out once, b (small, widened to FP32 once) from cache; 1 flop per element.
  void binary_broadcast_impl(BinaryOp op, const Tensor& a, const Tensor& b, const AxisView& view, bool swapped,
                             Tensor& out) const override {
    const std::vector<float> bf = b.to_vector();
    const void* pa = a.data();
    void* po = out.data();
    const DType da = a.dtype(), dout = out.dtype();
    parallel_blocks(a.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float ba[kBlock], bo[kBlock];
      const float* x = load_block(pa, da, i0, len, ba);
      float* r = out_block(po, dout, i0, bo);
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
      store_block(po, dout, i0, len, r);
    });
  }

  void broadcast_axis_impl(const Tensor& g, const AxisView& view, float alpha, Tensor& out) const override {
    const void* pg = g.data();
    void* po = out.data();
    const DType dg = g.dtype(), dout = out.dtype();
    parallel_blocks(out.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bo[kBlock];
      float* r = out_block(po, dout, i0, bo);
      for (int64_t j = 0; j < len; ++j)
        r[j] = alpha * load_as_f32(pg, dg, static_cast<size_t>(view.reduced_index(i0 + j)));
      store_block(po, dout, i0, len, r);
    });
  }

  // Reads x once, writes outer * inner values. As sum_rows: each output sums its l in order in
  // double; l is walked outer and a block of kCols outputs inner, so the reads are contiguous.
  void sum_axis_impl(const Tensor& x, const AxisView& view, float alpha, Tensor& out, bool accumulate) const override {
    const void* px = x.data();
    void* po = out.data();
    const DType dx = x.dtype(), dout = out.dtype();
    if (view.inner == 1) {  // the last axis: each output sums a contiguous run, a block at a time
      parallel_for(view.outer, [&](int64_t o) {
        double acc = 0.0;
        alignas(64) float buf[kBlock];
        for (int64_t l0 = 0; l0 < view.len; l0 += kBlock) {
          const int64_t len = std::min(kBlock, view.len - l0);
          const float* v = load_block(px, dx, o * view.len + l0, len, buf);
          for (int64_t j = 0; j < len; ++j) acc += v[j];
        }
        const float s = static_cast<float>(acc * static_cast<double>(alpha));
        store_from_f32(po, dout, static_cast<size_t>(o), accumulate ? load_as_f32(po, dout, static_cast<size_t>(o)) + s : s);
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
        const float* v = load_block(px, dx, (o * view.len + l) * view.inner + c0, len, buf);
        for (int64_t j = 0; j < len; ++j) acc[j] += v[j];
      }
      for (int64_t j = 0; j < len; ++j) {
        const size_t k = static_cast<size_t>(o * view.inner + c0 + j);
        const float s = static_cast<float>(acc[j] * static_cast<double>(alpha));
        store_from_f32(po, dout, k, accumulate ? load_as_f32(po, dout, k) + s : s);
      }
    }
  }

  // Per row (kernels/cpu/isa, the active path): reads x once (FP32 in place, else widened
  // into a row buffer), writes y once; one exp and ~4 flops per element.
  void softmax_impl(const Tensor& x, int64_t cols, bool log, bool causal, Tensor& y) const override {
    const void* px = x.data();
    void* py = y.data();
    const DType tx = x.dtype(), ty = y.dtype();
    const int64_t rows = x.numel() / cols;
    const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (x.numel() > kParallelThreshold)
    {
      std::vector<float> xb(static_cast<size_t>(cols)), yb(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t live = causal ? r % cols + 1 : cols;  // unmasked columns [0, live)
        const float* xr = load_block(px, tx, r * cols, cols, xb.data());
        float* yr = out_block(py, ty, r * cols, yb.data());
        blocks.softmax_row(xr, yr, cols, live, log);
        store_block(py, ty, r * cols, cols, yr);
      }
    }
  }

  // Per row (the active path): reads y and dy once (widened into row buffers unless FP32),
  // writes dx once.
  void softmax_backward_impl(const Tensor& y, const Tensor& dy, int64_t cols, bool log, bool causal,
                             Tensor& dx) const override {
    const void *pyv = y.data(), *pg = dy.data();
    void* pd = dx.data();
    const DType ty = y.dtype(), tg = dy.dtype(), td = dx.dtype();
    const int64_t rows = y.numel() / cols;
    const ElementBlocks& blocks = cpu_element_blocks();
#pragma omp parallel if (y.numel() > kParallelThreshold)
    {
      std::vector<float> yb(static_cast<size_t>(cols)), gb(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t live = causal ? r % cols + 1 : cols;
        const float* yr = load_block(pyv, ty, r * cols, cols, yb.data());
        const float* gr = load_block(pg, tg, r * cols, cols, gb.data());
        float* dr = out_block(pd, td, r * cols, db.data());
        blocks.softmax_row_backward(yr, gr, dr, cols, live, log);
        store_block(pd, td, r * cols, cols, dr);
      }
    }
  }

  // Reads N ids and N x D table elements, writes N x D: a copy of each row, no flops.
  void embedding_impl(const Tensor& table, const Tensor& ids, Tensor& out) const override {
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
  void embedding_backward_impl(const Tensor& dout, const Tensor& ids, Tensor& dtable) const override {
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
    const DType dg = dout.dtype();
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
          const float* g = load_block(pg, dg, order[i] * dim, dim, buf.data());
          for (int64_t c = 0; c < dim; ++c) dst[c] += g[c];
        }
      }
    }
  }

  // Per row (kernels/cpu/isa, the active path): reads x twice (from a row buffer once widened),
  // writes y once; ~7 flops per element.
  void layer_norm_impl(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) const override {
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
  void layer_norm_backward_impl(const Tensor& x, const Tensor* weight, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor* dweight, Tensor* dbias,
                                bool accumulate) const override {
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
          const float* xr = load_block(px, tx, r * cols, cols, xb.data());
          const float* gr = load_block(pg, tg, r * cols, cols, gb.data());
          float* dr = out_block(pd, td, r * cols, db.data());
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

  // Moves 2 x numel x dtype bytes; tiles of 32 x 32 keep both sides' lines in cache.
  void transpose_impl(const Tensor& x, Tensor& out) const override {
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
  void swap_axes_impl(const Tensor& x, const SwapAxesView& v, Tensor& out) const override {
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

  void gemm_impl(const GemmArgs& args, const GemmDims&) const override { cpu_gemm(args); }

  // Reads x once, writes N floats. Each column sums its rows in row order in double, as a
  // column at a time would, but rows are walked outer so the reads are contiguous.
  void sum_rows_impl(const Tensor& x, Tensor& out, bool accumulate) const override {
    const int64_t rows = x.dim(0), cols = x.dim(1);
    const void* px = x.data();
    const DType dx = x.dtype();
    float* po = out.data_as<float>();
    constexpr int64_t kCols = 256;
    const int64_t col_blocks = (cols + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelThreshold)
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      const int64_t c0 = cb * kCols, len = std::min(kCols, cols - c0);
      double acc[kCols] = {};
      alignas(64) float buf[kCols];
      for (int64_t m = 0; m < rows; ++m) {
        const float* v = load_block(px, dx, m * cols + c0, len, buf);
        for (int64_t j = 0; j < len; ++j) acc[j] += v[j];
      }
      for (int64_t j = 0; j < len; ++j)
        po[c0 + j] = accumulate ? po[c0 + j] + static_cast<float>(acc[j]) : static_cast<float>(acc[j]);
    }
  }

  void sum_impl(const Tensor& x, Tensor& out) const override {
    const void* px = x.data();
    out.data_as<float>()[0] = static_cast<float>(with_dtype(x.dtype(), [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      return deterministic_sum(x.numel(), [&](int64_t i) { return (double)ld<D>(px, i); });
    }));
  }

  void mse_forward_impl(const Tensor& pred, const Tensor& target, Tensor& out) const override {
    const void *pp = pred.data(), *pt = target.data();
    const DType dp = pred.dtype(), dt = target.dtype();
    const double s = with_dtype(dp, [&](auto tp) {
      return with_dtype(dt, [&](auto tt) {
        constexpr DType P = decltype(tp)::value, T = decltype(tt)::value;
        return deterministic_sum(pred.numel(), [&](int64_t i) {
          const double d = (double)ld<P>(pp, i) - (double)ld<T>(pt, i);
          return d * d;
        });
      });
    });
    out.data_as<float>()[0] = static_cast<float>(s / static_cast<double>(pred.numel()));
  }

  void mse_backward_impl(const Tensor& pred, const Tensor& target, const Tensor& g, Tensor& dpred) const override {
    const float factor = 2.0f * scalar_value(g) / static_cast<float>(pred.numel());
    const void *pp = pred.data(), *pt = target.data();
    void* pd = dpred.data();
    const DType dp = pred.dtype(), dt = target.dtype(), dd = dpred.dtype();
    parallel_blocks(pred.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bp[kBlock], bt[kBlock], bo[kBlock];
      const float* p = load_block(pp, dp, i0, len, bp);
      const float* t = load_block(pt, dt, i0, len, bt);
      float* r = out_block(pd, dd, i0, bo);
      for (int64_t j = 0; j < len; ++j) r[j] = factor * (p[j] - t[j]);
      store_block(pd, dd, i0, len, r);
    });
  }

  void cross_entropy_impl(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& dlogits) const override {
    const int64_t rows = logits.dim(0), classes = logits.dim(1);
    std::vector<float> lab(static_cast<size_t>(labels.numel()));  // read in place: no host read counted
    for (size_t r = 0; r < lab.size(); ++r) lab[r] = load_as_f32(labels.data(), labels.dtype(), r);
    for (int64_t r = 0; r < rows; ++r) {
      const float l = lab[r];
      if (!(l >= 0.0f) || l >= static_cast<float>(classes) || l != std::floor(l))
        throw Error("cross_entropy: label " + std::to_string(l) + " at row " + std::to_string(r) +
                    " is not a class index in [0, " + std::to_string(classes) + ")");
    }
    const void* px = logits.data();
    const DType dx = logits.dtype();
    float* pd = dlogits.data_as<float>();
    thread_local std::vector<double> row_loss;
    row_loss.assign(static_cast<size_t>(rows), 0.0);
    double* rl = row_loss.data();
    const double inv_rows = 1.0 / static_cast<double>(rows);
    parallel_for(rows, [&](int64_t r) {
      // log-softmax with the row maximum subtracted: exp never overflows for large logits.
      float mx = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, load_as_f32(px, dx, r * classes + c));
      double z = 0.0;
      for (int64_t c = 0; c < classes; ++c) z += std::exp((double)load_as_f32(px, dx, r * classes + c) - mx);
      const double log_z = std::log(z) + mx;
      const int64_t label = static_cast<int64_t>(lab[r]);
      rl[r] = log_z - (double)load_as_f32(px, dx, r * classes + label);
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp((double)load_as_f32(px, dx, r * classes + c) - log_z);
        pd[r * classes + c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_rows);
      }
    });
    double total = 0.0;
    for (int64_t r = 0; r < rows; ++r) total += rl[r];
    loss.data_as<float>()[0] = static_cast<float>(total * inv_rows);
  }

  // Reads every gradient once (4 or 2 bytes per element), writes nothing; 3 flops per element.
  void guard_impl(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf,
                  Tensor& norm) const override {
    const float inv = scalar_value(inv_scale);
    const ElementBlocks& blocks_isa = cpu_element_blocks();
    static_assert(kReduceLanes == 8, "sum_squares_8 sums 8 chunks side by side");
    double total = 0.0;
    bool nonfinite = false;
    for (const Tensor* g : grads) {
      const void* pg = g->data();
      // One read per element: the finite check and the square of the unscaled value together.
      // A non-finite element makes its square non-finite, so the sum carries the flag.
      // (The square of a float is exact in double, so the sum is the same fused or not.)
      // Whole groups of 8 chunks go to the active ISA's element kernel (the same sums, the
      // same bits, read 8 elements of each chunk at a time instead of one).
      const GemmElem elem = gemm_elem_of(g->dtype());
      const size_t elem_bytes = dtype_size(g->dtype());
      const double s = with_dtype(g->dtype(), [&](auto tag) {
        constexpr DType D = decltype(tag)::value;
        return deterministic_sum_grouped(
            g->numel(),
            [&](int64_t i) {
              const float u = ld<D>(pg, i) * inv;
              return (double)u * (double)u;
            },
            [&](int64_t base, double* out) {
              blocks_isa.sum_squares_8(static_cast<const char*>(pg) + base * elem_bytes, elem, kReduceChunk,
                                       kReduceChunk, inv, out);
            });
      });
      if (!std::isfinite(s)) nonfinite = true;
      total += s;
    }
    found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
    norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));  // one rounding, after the root
  }

  void clip_coefficient_impl(const Tensor& norm, float max_norm, Tensor& clip_coef) const override {
    clip_coef.data_as<float>()[0] = clip_coefficient_of(scalar_value(norm), max_norm);
  }

  // Reads and writes every gradient once.
  void unscale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& inv_scale,
                            Tensor& found_inf) const override {
    const float inv = scalar_value(inv_scale);
    const ElementBlocks& blocks_isa = cpu_element_blocks();
    bool nonfinite = false;
    for (Tensor* g : grads) {
      void* pg = g->data();
      const DType dg = g->dtype();
      const int64_t n = g->numel();
      const int64_t blocks = (n + kBlock - 1) / kBlock;
      int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > kParallelThreshold)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
        alignas(64) float bg[kBlock];
        const float* v = load_block(pg, dg, i0, len, bg);
        float* r = out_block(pg, dg, i0, bg);
        const int local = blocks_isa.unscale(v, r, len, inv);
        store_block(pg, dg, i0, len, r);
        bad |= local;
      }
      nonfinite = nonfinite || bad != 0;
    }
    found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  }

  void scale_inplace_impl(const std::vector<Tensor*>& grads, const Tensor& factor) const override {
    const float f = scalar_value(factor);
    for (Tensor* g : grads) scale_impl(*g, f, *g);
  }

  void clamp_inplace_impl(Tensor& x, float lo, float hi) const override {
    void* px = x.data();
    const DType dx = x.dtype();
    parallel_blocks(x.numel(), [&](int64_t i0, int64_t len) {
      alignas(64) float bx[kBlock];
      const float* v = load_block(px, dx, i0, len, bx);
      float* r = out_block(px, dx, i0, bx);
      // NaN stays NaN (as torch.clamp): comparisons with NaN are false.
      for (int64_t j = 0; j < len; ++j) r[j] = v[j] < lo ? lo : (v[j] > hi ? hi : v[j]);
      store_block(px, dx, i0, len, r);
    });
  }

  // One pass: reads grad, master, m, v; writes master, m, v and the working copy.
  // FP32 grads and an FP16/BF16 working copy: 30 bytes per element; ~15 flops, 1 sqrt, 3 div.
  void adamw_impl(const AdamWHyper& hyper, const std::vector<AdamWSlot>& slots, const StepScalars& sc) const override {
    if (scalar_value(*sc.found_inf) != 0.0f) return;  // a skipped step changes nothing
    const float inv = scalar_value(*sc.inv_scale), coef = scalar_value(*sc.clip_coef);
    const float applied = scalar_value(*sc.applied_steps);
    const AdamWStep h{scalar_value(*sc.lr),
                      hyper.beta1,
                      hyper.beta2,
                      hyper.eps,
                      adamw_bias_correction(hyper.beta1, applied),
                      adamw_bias_correction(hyper.beta2, applied)};
    for (const AdamWSlot& s : slots) {
      float* p = s.master->data_as<float>();
      float* m = s.m->data_as<float>();
      float* v = s.v->data_as<float>();
      const void* g = s.grad->data();
      const DType dg = s.grad->dtype();
      void* w = s.working ? s.working->data() : nullptr;
      const DType dw = s.working ? s.working->dtype() : DType::F32;
      const float wd = s.weight_decay;
      const bool stream = s.master->numel() >= kStreamThreshold;
      parallel_blocks(s.master->numel(), [&](int64_t i0, int64_t len) {
        alignas(64) float bg[kBlock];
        const float* gb = load_block(g, dg, i0, len, bg);
        void* wi = w ? static_cast<char*>(w) + i0 * dtype_size(dw) : nullptr;
        const bool wrote_w = adamw_block(gb, p + i0, m + i0, v + i0, wi, dw, len, inv, coef, h, wd, stream);
        if (w && !wrote_w) store_block(w, dw, i0, len, p + i0);  // the working copy, in the same pass
      });
    }
  }

  void sgd_impl(float momentum, const std::vector<SgdSlot>& slots, const StepScalars& sc) const override {
    if (scalar_value(*sc.found_inf) != 0.0f) return;
    const float inv = scalar_value(*sc.inv_scale), coef = scalar_value(*sc.clip_coef);
    const float lr = scalar_value(*sc.lr);
    const ElementBlocks& blocks_isa = cpu_element_blocks();
    for (const SgdSlot& s : slots) {
      float* p = s.master->data_as<float>();
      float* buf = s.momentum && s.momentum->defined() ? s.momentum->data_as<float>() : nullptr;
      const void* g = s.grad->data();
      const DType dg = s.grad->dtype();
      void* w = s.working ? s.working->data() : nullptr;
      const DType dw = s.working ? s.working->dtype() : DType::F32;
      const float wd = s.weight_decay;
      parallel_blocks(s.master->numel(), [&](int64_t i0, int64_t len) {
        alignas(64) float bg[kBlock];
        const float* gb = load_block(g, dg, i0, len, bg);
        float* pp = p + i0;
        blocks_isa.sgd(SgdBlock{gb, pp, buf ? buf + i0 : nullptr, len, inv, coef, lr, momentum, wd});
        if (w) store_block(w, dw, i0, len, pp);
      });
    }
  }

  void lookup_impl(const Tensor& table, const Tensor& index, Tensor& out) const override {
    out.data_as<float>()[0] = table.data_as<const float>()[table_index(scalar_value(index), table.numel())];
  }

  void count_applied_impl(Tensor& count, const Tensor& found_inf) const override {
    if (scalar_value(found_inf) == 0.0f) count.data_as<float>()[0] += 1.0f;
  }

  // Host memory is the device's: the values are copied now and are ready at once.
  std::unique_ptr<HostReadback> read_async_impl(const std::vector<const Tensor*>& scalars) const override {
    std::vector<float> values;
    for (const Tensor* t : scalars) {
      values.push_back(scalar_value(*t));
    }
    return std::make_unique<ReadyReadback>(std::move(values));
  }

  void scaler_update_impl(const ScalerConfig& c, Tensor& scale, Tensor& growth_tracker, Tensor& hysteresis_left,
                          const Tensor& found_inf) const override {
    scaler_transition(scalar_value(found_inf), scale.data_as<float>()[0], growth_tracker.data_as<float>()[0],
                      hysteresis_left.data_as<float>()[0], c.growth_factor, c.backoff_factor,
                      static_cast<float>(c.growth_interval), static_cast<float>(c.hysteresis), c.min_scale,
                      c.max_scale);
  }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace belay
