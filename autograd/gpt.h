// A decoder-only transformer (GPT-2's shape, small): token and position embeddings, pre-
// LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm, and an output
// head tied to the token embedding. Built from the ops of autograd/ops.h, so it runs on every
// backend and under every belt; apps/run trains it on real text (belay train --model gpt).
//
// Choices, and why:
// - Tied head (logits = x wte^T), as GPT-2: the head and the table are the same [V, D]
//   matrix, so the model has V D fewer parameters and the rows of rare tokens still learn.
// - q, k and v as three Linear(D, D) (GPT-2 has one Linear(D, 3D) split after): the same
//   product, but each of q, k, v is a whole matrix belay's GEMM and the state dict can name.
// - GELU with erf (PyTorch's default) unless GptConfig::gelu asks for the tanh form GPT-2 used.
// - Initialisation as GPT-2's: every Linear weight and both embeddings normal(0, 0.02),
//   biases 0, LayerNorm 1 and 0; the two projections that write into the residual stream
//   (attn.proj, mlp.proj) normal(0, 0.02 / sqrt(2 layers)), so the stream's variance does not
//   grow with depth.
// - Mixed precision: set_working_dtype gives the Linear weights FP16/BF16 working copies and
//   keeps the embeddings and the LayerNorms in FP32, so the residual stream is FP32 (as under
//   PyTorch's autocast: embedding unlisted on an FP32 table, layer_norm in FP32, the products in
//   the low dtype). The tied head reads the FP32 table through autocast's cast.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "autograd/modules.h"

namespace belay {

struct KvCache;  // autograd/gpt_decode.h: the keys and values of the positions decoded so far
struct KvLayer;

struct GptConfig {
  int64_t vocab = 256;    // token ids in [0, vocab)
  int64_t context = 64;   // the longest sequence (rows of the position table)
  int64_t width = 128;    // D, the residual stream
  int64_t layers = 2;     // blocks
  int64_t heads = 4;      // D must be a multiple of heads
  // Attention as one fused op (autograd/ops.h attention: no [B, H, T, T] scores kept for the
  // backward) or as bmm, causal softmax, bmm (the reference; the same math, other roundings).
  bool fused_attention = true;
  // The MLP's GELU: Activation::Gelu (erf, PyTorch's default) or Activation::GeluTanh (GPT-2's).
  Activation gelu = Activation::Gelu;
  // Parameters: V D + C D + layers (12 D^2 + 13 D) + 2 D (the head is tied).
  double parameter_count() const;
  void validate() const;  // throws UsageError naming the first bad size
};

// One pre-LayerNorm block: x + attn(ln_1(x)), then that + mlp(ln_2(that)).
class GptBlock {
 public:
  GptBlock(const GptConfig& c, int index, Rng& rng, Device device);
  // x: the residual stream [B T, D] of B sequences of T tokens.
  Var forward(const Var& x, int64_t batch, int64_t tokens);
  // The same for `tokens` new positions after the `start` that `layer` holds, their k and v
  // appended to it (autograd/gpt_decode.cpp; under NoGrad).
  Var forward_cached(const Var& x, int64_t batch, int64_t tokens, KvLayer& layer, int64_t start);
  std::vector<std::pair<std::string, Var>> named_parameters() const;
  void set_working_dtype(DType dtype);

 private:
  Var attention(const Var& h, int64_t batch, int64_t tokens);
  Var mlp(const Var& h);

  int64_t heads_, width_;
  bool fused_attention_;
  Activation gelu_;
  std::string prefix_;
  LayerNorm ln_1_, ln_2_;
  Linear q_, k_, v_, attn_proj_, fc_, mlp_proj_;
  std::string softmax_path_, gelu_path_;
};

class Gpt : public Module {
 public:
  Gpt(const GptConfig& config, Rng& rng, Device device = Device::cpu());
  // ids [B, T]: token ids held as FP32 (as TokenDataset's batches), T <= context.
  // Returns the logits [B T, V], rows in the ids' order (cross_entropy's input).
  Var forward(const Var& ids) override;
  // Incremental decoding (autograd/gpt_decode.cpp, under NoGrad): ids [B, t] are the tokens at
  // positions cache.length() onward; their k and v join the cache. Returns the logits of the
  // last position only, [B, V], with the bits of forward's last row on the whole sequence.
  Var forward_cached(const Var& ids, KvCache& cache);
  std::vector<std::pair<std::string, Var>> named_parameters() const override;
  void set_working_dtype(DType dtype) override;
  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
  Embedding wte_, wpe_;
  std::vector<std::unique_ptr<GptBlock>> blocks_;
  LayerNorm ln_f_;
};

}  // namespace belay
