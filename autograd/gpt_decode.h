// Incremental decoding of the GPT (autograd/gpt.h), for sampling: a cache of every block's
// keys and values, so that a new token costs one position's products instead of the whole
// window's. The prompt runs once (Gpt::forward_cached on all its tokens fills the cache), then
// each new token runs alone against the cached keys. Nothing here records a graph.
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/gpt.h"

namespace belay {

// One block's keys and values, [B, H, capacity, d] each: position p of head h of sequence b
// is row (b H + h) capacity + p. Allocated at the first write, in the dtype and on the device
// of the k and v it is given (FP16/BF16 under autocast), then reused for every position.
struct KvLayer {
  int64_t batch = 0, heads = 0, capacity = 0, head_dim = 0;
  Tensor k, v;
  // k_new, v_new [B, H, t, d] become positions [start, start + t).
  void write(const Tensor& k_new, const Tensor& v_new, int64_t start);
  // Positions [0, n) as dense [B, H, n, d] tensors: a copy when n < capacity, because a
  // belay Tensor is dense and has no strided view (the copy moves n D elements per block,
  // as many as the attention of one query reads anyway).
  Tensor keys(int64_t n) const;
  Tensor values(int64_t n) const;
};

// The cache of a whole GPT for `batch` sequences decoded together, up to its context.
struct KvCache {
  KvCache(const GptConfig& config, int64_t batch);
  int64_t length() const { return length_; }  // positions held, the same in every block
  void clear() { length_ = 0; }                // forget them (the memory stays for the next)
  void advance(int64_t tokens) { length_ += tokens; }

  int64_t batch, capacity;
  std::vector<KvLayer> layers;

 private:
  int64_t length_ = 0;
};

// Attention of the newest positions against the cache: q [B, H, Tq, d], k and v [B, H, Tk, d]
// (every key up to the last query's position) -> [B, H, Tq, d]. The causal mask is aligned at
// the end (query i sees keys j <= i + Tk - Tq), which this path needs in two forms only: Tq =
// Tk (the prompt: the square causal mask) and Tq = 1 (one new token: every key, no mask). The
// same ops in the same order as GptBlock::attention, so the bits of its rows: fused, the fused
// op (any Tq <= Tk); else bmm, softmax, bmm (those two forms only).
Var attend_cached(const Var& q, const Var& k, const Var& v, float scale_factor, bool fused);

}  // namespace belay
