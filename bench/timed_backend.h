// Where a step's time goes: a Backend that forwards every call to the CPU backend and adds
// the call's time (harness.h's clock) to the part of the step it belongs to. Installed with
// kernels/backend_hook.h only for the breakdown runs of bench/gpt.cpp; the timed rows run
// without it. What the parts do not cover (the step's time minus their sum) is belay's own
// host work: the autograd graph, allocation, autocast's bookkeeping.
#pragma once
#include <array>
#include <memory>

#include "engine/backend.h"

namespace belay::bench {

enum class Part {
  GemmLinear,   // gemm with batch 1: the Linears' three products and the tied head
  GemmBatched,  // gemm with batch > 1: attention's q k^T and p v (bmm)
  Softmax,      // attention's causal softmax, forward and backward
  Attention,    // the fused attention op, forward and backward (--attention fused)
  LayerNorm,    // forward and backward
  Elementwise,  // gelu, add, scale, broadcasts, the bias gradients (sum_rows), fill, ...
  Heads,        // the head split and merge copies (swap_axes, transpose), copy_bytes
  Embedding,    // forward and backward
  Loss,         // cross_entropy (fused softmax + gradient), mse
  Cast,         // dtype casts: autocast of the tied head's FP32 table, working copies
  Belts,        // guard, clip coefficient, unscale, scaler update, step scalars, readback
  Optimizer,    // AdamW (and SGD)
  kCount
};
const char* part_name(Part p);

struct PartTotals {
  std::array<double, static_cast<size_t>(Part::kCount)> ms{};
  std::array<long, static_cast<size_t>(Part::kCount)> calls{};
};

// While one lives, backend_for(Device::cpu()) is the timed wrapper (kernels/backend_hook.h);
// its totals add up every call from then on, read with `clock_ms` (harness.h's now_ms: the
// step is timed with the same clock). A call made inside another (a kernel that casts
// through the backend) counts in the outer one's part only. One at a time, on the main thread.
class TimedBackend;
class PartTimer {
 public:
  explicit PartTimer(double (*clock_ms)());
  ~PartTimer();
  PartTimer(const PartTimer&) = delete;
  PartTimer& operator=(const PartTimer&) = delete;
  PartTotals& totals();

 private:
  std::unique_ptr<TimedBackend> backend_;
};

}  // namespace belay::bench
