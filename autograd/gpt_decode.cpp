#include "autograd/gpt_decode.h"

#include <cmath>

#include "autograd/ops.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {

// Copies `rows` rows of d elements for each of the B H items: item i's rows start at
// src_row0 + i src_rows (source) and dst_row0 + i dst_rows (destination).
void copy_item_rows(const Tensor& src, int64_t src_rows, int64_t src_row0, Tensor& dst, int64_t dst_rows,
                    int64_t dst_row0, int64_t items, int64_t rows, int64_t d) {
  const size_t row_bytes = static_cast<size_t>(d) * dtype_size(src.dtype());
  const Backend& be = backend_for(src.device());
  for (int64_t i = 0; i < items; ++i)
    be.copy_bytes(static_cast<char*>(dst.data()) + static_cast<size_t>(i * dst_rows + dst_row0) * row_bytes,
                  dst.device(),
                  static_cast<const char*>(src.data()) + static_cast<size_t>(i * src_rows + src_row0) * row_bytes,
                  src.device(), static_cast<size_t>(rows) * row_bytes);
}

Tensor first_positions(const KvLayer& layer, const Tensor& cache, int64_t n) {
  if (!cache.defined() || n < 1 || n > layer.capacity)
    throw Error("kv cache: positions [0, " + std::to_string(n) + ") asked of a cache of " +
                std::to_string(layer.capacity) + (cache.defined() ? "" : " that holds none"));
  if (n == layer.capacity) return cache;
  Tensor out = Tensor::empty(Shape{layer.batch, layer.heads, n, layer.head_dim}, cache.dtype(), cache.device());
  copy_item_rows(cache, layer.capacity, 0, out, n, 0, layer.batch * layer.heads, n, layer.head_dim);
  return out;
}

}  // namespace

void KvLayer::write(const Tensor& k_new, const Tensor& v_new, int64_t start) {
  const int64_t t = k_new.rank() == 4 ? k_new.dim(2) : 0;
  const Shape want{batch, heads, t, head_dim};
  if (t == 0 || k_new.shape() != want || v_new.shape() != want || v_new.dtype() != k_new.dtype())
    throw Error("kv cache: expected k and v [" + std::to_string(batch) + ", " + std::to_string(heads) + ", t, " +
                std::to_string(head_dim) + "], got " + k_new.describe() + " and " + v_new.describe());
  if (start < 0 || start + t > capacity)
    throw Error("kv cache: positions [" + std::to_string(start) + ", " + std::to_string(start + t) +
                ") do not fit its " + std::to_string(capacity));
  if (!k.defined() || k.dtype() != k_new.dtype() || k.device() != k_new.device()) {
    // A new dtype (autocast switched) or device: the positions held are of the old one.
    if (start != 0 && k.defined())
      throw Error("kv cache: k and v came in " + k_new.describe() + " after positions cached as " + k.describe() +
                  ": clear the cache and run the sequence again");
    const Shape full{batch, heads, capacity, head_dim};
    k = Tensor::empty(full, k_new.dtype(), k_new.device());
    v = Tensor::empty(full, k_new.dtype(), k_new.device());
  }
  copy_item_rows(k_new, t, 0, k, capacity, start, batch * heads, t, head_dim);
  copy_item_rows(v_new, t, 0, v, capacity, start, batch * heads, t, head_dim);
}

Tensor KvLayer::keys(int64_t n) const { return first_positions(*this, k, n); }
Tensor KvLayer::values(int64_t n) const { return first_positions(*this, v, n); }

KvCache::KvCache(const GptConfig& config, int64_t batch_) : batch(batch_), capacity(config.context) {
  config.validate();
  if (batch < 1) throw UsageError("kv cache: batch must be at least 1, got " + std::to_string(batch));
  KvLayer layer;
  layer.batch = batch;
  layer.heads = config.heads;
  layer.capacity = config.context;
  layer.head_dim = config.width / config.heads;
  layers.assign(static_cast<size_t>(config.layers), layer);
}

Var attend_cached(const Var& q, const Var& k, const Var& v, float scale_factor, bool fused) {
  // The fused op's causal mask is aligned at the end of the keys: a prompt (Tq == Tk) gets the
  // lower triangle, one new token every cached key, as the three ops below do.
  if (fused) return attention(q, k, v, /*causal=*/true, scale_factor);
  const int64_t tq = q.shape()[q.shape().rank() - 2], tk = k.shape()[k.shape().rank() - 2];
  if (tq != tk && tq != 1)
    throw Error("attend_cached: " + std::to_string(tq) + " queries against " + std::to_string(tk) +
                " keys: this path runs a whole prompt (as many queries as keys) or one new token");
  const Var scores = scale(bmm(q, k, false, true), scale_factor);  // [B, H, Tq, Tk]
  return bmm(softmax(scores, /*causal=*/tq > 1), v);               // [B, H, Tq, d]
}

Var GptBlock::forward_cached(const Var& x, int64_t batch, int64_t tokens, KvLayer& layer, int64_t start) {
  const Var h = ln_1_(x);
  auto heads_of = [&](Linear& proj) {  // [B t, D] -> [B, H, t, D / H], as attention()
    return split_heads(reshape(proj(h), {batch, tokens, width_}), heads_);
  };
  const Var q = heads_of(q_), k = heads_of(k_), v = heads_of(v_);
  layer.write(k.value(), v.value(), start);
  Var y;
  {
    ModuleScope scope(softmax_path_.c_str());
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(width_ / heads_));
    y = attend_cached(q, Var(layer.keys(start + tokens)), Var(layer.values(start + tokens)), inv_sqrt_d,
                      fused_attention_);
  }
  const Var after_attn = add(x, attn_proj_(reshape(merge_heads(y), {batch * tokens, width_})));
  return add(after_attn, mlp(ln_2_(after_attn)));
}

Var Gpt::forward_cached(const Var& ids, KvCache& cache) {
  if (grad_enabled()) throw Error("gpt: forward_cached keeps no graph: call it under NoGrad");
  if (!ids.defined() || ids.shape().rank() != 2)
    throw UsageError("gpt: expects token ids [B, T], got " + (ids.defined() ? ids.value().describe() : "nothing"));
  const int64_t batch = ids.shape()[0], tokens = ids.shape()[1], start = cache.length();
  if (batch != cache.batch || static_cast<int64_t>(cache.layers.size()) != config_.layers ||
      cache.capacity != config_.context)
    throw Error("gpt: the kv cache was made for another batch or model (batch " + std::to_string(cache.batch) +
                ", ids " + ids.value().describe() + ")");
  if (start > 0 && tokens != 1)
    throw Error("gpt: forward_cached runs a prompt into an empty cache or one token after it, not " +
                std::to_string(tokens) + " tokens after " + std::to_string(start));
  if (start + tokens > config_.context)
    throw UsageError("gpt: positions " + std::to_string(start) + " to " + std::to_string(start + tokens - 1) +
                     " do not fit the context of " + std::to_string(config_.context) +
                     ": clear the cache and run the last tokens again");
  Tensor positions = Tensor::empty(Shape{tokens}, DType::F32, Device::cpu());
  for (int64_t t = 0; t < tokens; ++t) positions.data_as<float>()[t] = static_cast<float>(start + t);
  if (!ids.device().is_cpu()) positions = positions.to(ids.device());
  Var x = reshape(add(wte_(ids), wpe_(Var(positions))), {batch * tokens, config_.width});
  for (size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->forward_cached(x, batch, tokens, cache.layers[i], start);
  cache.advance(tokens);
  // Only the last position's logits are wanted: row t - 1 of each sequence ([B, t, D] -> [t, B, D]).
  if (tokens > 1) x = select_row(transpose(reshape(x, {batch, tokens, config_.width}), 0, 1), tokens - 1);
  x = ln_f_(x);
  ModuleScope scope("head");
  return linear(x, wte_.weight, Var());  // tied, as forward
}

}  // namespace belay
