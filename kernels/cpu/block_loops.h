// The loops every CPU kernel file shares (kernels/cpu/*_kernels.cpp): OpenMP over blocks, a
// block of a tensor as FP32, the elementwise map (load blocks, compute, store one block), and
// the deterministic sum. Internal to kernels/cpu.
//
// How the loops are shaped, so they vectorize: the dtype is resolved once per call (a template
// parameter or a block conversion), never per element; elementwise kernels work on blocks of
// kBlock elements converted to FP32 in a stack buffer (in L1), computed by a plain loop over
// float pointers, and converted back. Results are the same bits as the element-at-a-time
// formulation: the same functions of kernels/common, in the same order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "kernels/cpu/cpu_convert.h"

namespace belay::cpu {

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

// f(t, i0, len) on the blocks of every tensor t (sizes[t] elements), all the tensors' blocks in
// one loop shared by the threads. An optimizer step over a model's tensors one parallel_blocks
// at a time ran each small one (a bias, a LayerNorm weight, most of the default GPT's under
// kParallelThreshold) on one thread, and forked once per tensor.
template <class F>
void parallel_blocks_of(const std::vector<int64_t>& sizes, F&& f) {
  thread_local std::vector<int64_t> first;  // first[t]: tensor t's first block; first.back(): all
  first.assign(1, 0);
  int64_t total = 0;
  for (const int64_t n : sizes) {
    first.push_back(first.back() + (n + kBlock - 1) / kBlock);
    total += n;
  }
  const int64_t* starts = first.data();
  const int64_t tensors = static_cast<int64_t>(sizes.size()), blocks = first.back();
#pragma omp parallel for schedule(static) if (total > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t = std::upper_bound(starts, starts + tensors + 1, b) - starts - 1;
    const int64_t i0 = (b - starts[t]) * kBlock;
    f(t, i0, std::min(kBlock, sizes[static_cast<size_t>(t)] - i0));
  }
}

// Elements [i0, i0 + len) of a tensor as FP32: a pointer into it when it is FP32, else
// converted into buf.
inline const float* load_block(const void* base, DType dtype, int64_t i0, int64_t len, float* buf) {
  switch (dtype) {
    case DType::F16: cvt_f16_to_f32(static_cast<const uint16_t*>(base) + i0, buf, len); return buf;
    case DType::BF16: cvt_bf16_to_f32(static_cast<const uint16_t*>(base) + i0, buf, len); return buf;
    default: return static_cast<const float*>(base) + i0;
  }
}
// Where a block's FP32 results go: straight into an FP32 tensor, else buf (see store_block).
inline float* out_block(void* base, DType dtype, int64_t i0, float* buf) {
  return dtype == DType::F32 ? static_cast<float*>(base) + i0 : buf;
}
// Writes FP32 values to elements [i0, i0 + len), rounding once into the tensor's dtype.
inline void store_block(void* base, DType dtype, int64_t i0, int64_t len, const float* vals) {
  switch (dtype) {
    case DType::F16: cvt_f32_to_f16(vals, static_cast<uint16_t*>(base) + i0, len); break;
    case DType::BF16: cvt_f32_to_bf16(vals, static_cast<uint16_t*>(base) + i0, len); break;
    default:
      if (static_cast<float*>(base) + i0 != vals) std::memcpy(static_cast<float*>(base) + i0, vals, len * 4);
  }
}

template <size_t>
using BlockPtr = const float*;

template <class F, size_t... I, class... In>
int map_blocks_impl(Tensor& out, F& f, std::index_sequence<I...>, const In&... in) {
  constexpr size_t kIn = sizeof...(In);
  void* po = out.data();
  const DType out_dtype = out.dtype();
  const void* pin[kIn + 1] = {in.data()...};
  const DType in_dtype[kIn + 1] = {in.dtype()...};
  const int64_t n = out.numel(), blocks = (n + kBlock - 1) / kBlock;
  constexpr bool kFlags = std::is_same_v<std::invoke_result_t<F&, int64_t, int64_t, float*, BlockPtr<I>...>, int>;
  int flags = 0;
#pragma omp parallel for schedule(static) reduction(| : flags) if (n > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    alignas(64) float buf[kIn + 1][kBlock];
    float* r = out_block(po, out_dtype, i0, buf[kIn]);
    if constexpr (kFlags)
      flags |= f(i0, len, r, load_block(pin[I], in_dtype[I], i0, len, buf[I])...);
    else
      f(i0, len, r, load_block(pin[I], in_dtype[I], i0, len, buf[I])...);
    store_block(po, out_dtype, i0, len, r);
  }
  return flags;
}

// The elementwise loop, written once: out's elements in blocks of kBlock, in parallel; each
// input's block as FP32 (load_block), the results written by
//   f(i0, len, r, x...)   (r: the FP32 output block; x...: the inputs' blocks, in order)
// into out_block and rounded once into out's dtype (store_block). An output that is also an
// input reads its block before f writes it. When f returns int, the results of all blocks are
// OR-ed and returned (unscale's found-non-finite flag); otherwise 0.
template <class F, class... In>
int map_blocks(Tensor& out, F&& f, const In&... in) {
  return map_blocks_impl(out, f, std::index_sequence_for<In...>{}, in...);
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
decltype(auto) with_dtype(DType dtype, F&& f) {
  switch (dtype) {
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

// The value of a one-element FP32 tensor of this backend. CPU "device memory" is host
// memory, so a kernel reads it directly (not through Tensor::item, which counts host reads).
inline float scalar_value(const Tensor& t) { return t.data_as<const float>()[0]; }

}  // namespace belay::cpu
