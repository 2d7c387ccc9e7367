#include "autograd/gpt.h"

#include <cmath>

#include "engine/error.h"

namespace belay {

double GptConfig::parameter_count() const {
  const double v = static_cast<double>(vocab), c = static_cast<double>(context), d = static_cast<double>(width);
  return v * d + c * d + static_cast<double>(layers) * (12.0 * d * d + 13.0 * d) + 2.0 * d;
}

void GptConfig::validate() const {
  auto positive = [](const char* name, int64_t n) {
    if (n <= 0) throw UsageError(std::string("gpt: --") + name + " must be positive, got " + std::to_string(n));
  };
  positive("vocab", vocab);
  positive("context", context);
  positive("width", width);
  positive("layers", layers);
  positive("heads", heads);
  if (width % heads != 0)
    throw UsageError("gpt: --width " + std::to_string(width) + " is not a multiple of --heads " + std::to_string(heads) +
                     " (each head gets width / heads dimensions)");
}

namespace {
const float kInitStd = 0.02f;  // GPT-2's
std::string block_prefix(int index) { return "blocks." + std::to_string(index) + "."; }
}  // namespace

GptBlock::GptBlock(const GptConfig& c, int index, Rng& rng, Device device)
    : heads_(c.heads),
      width_(c.width),
      fused_attention_(c.fused_attention),
      gelu_(c.gelu),
      prefix_(block_prefix(index)),
      ln_1_(c.width, 1e-5f, device, prefix_ + "ln_1."),
      ln_2_(c.width, 1e-5f, device, prefix_ + "ln_2."),
      q_(c.width, c.width, rng, true, device, prefix_ + "attn.q.", kInitStd),
      k_(c.width, c.width, rng, true, device, prefix_ + "attn.k.", kInitStd),
      v_(c.width, c.width, rng, true, device, prefix_ + "attn.v.", kInitStd),
      attn_proj_(c.width, c.width, rng, true, device, prefix_ + "attn.proj.",
                 kInitStd / std::sqrt(2.0f * static_cast<float>(c.layers))),
      fc_(c.width, 4 * c.width, rng, true, device, prefix_ + "mlp.fc.", kInitStd),
      mlp_proj_(4 * c.width, c.width, rng, true, device, prefix_ + "mlp.proj.",
                kInitStd / std::sqrt(2.0f * static_cast<float>(c.layers))),
      softmax_path_(prefix_ + "attn"),
      gelu_path_(prefix_ + "mlp.act") {}

// Causal self-attention of B sequences of T tokens: h [B T, D] -> [B T, D]. The fused path
// reads the heads where the Linears wrote them ([B, T, H d]: attention_heads); the three-op
// path splits them into [B, H, T, d] for its bmm and merges them back.
Var GptBlock::attention(const Var& h, int64_t batch, int64_t tokens) {
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(width_ / heads_));
  auto rows_of = [&](Linear& proj) { return reshape(proj(h), {batch, tokens, width_}); };  // [B, T, D]
  const Var q = rows_of(q_), k = rows_of(k_), v = rows_of(v_);
  Var y;  // [B, T, D]
  {
    ModuleScope scope(softmax_path_.c_str());
    if (fused_attention_) {
      y = attention_heads(q, k, v, heads_, /*causal=*/true, inv_sqrt_d);
    } else {
      const Var qh = split_heads(q, heads_), kh = split_heads(k, heads_), vh = split_heads(v, heads_);
      const Var scores = scale(bmm(qh, kh, false, true), inv_sqrt_d);  // [B, H, T, T]
      y = merge_heads(bmm(softmax(scores, /*causal=*/true), vh));     // [B, H, T, d] -> [B, T, D]
    }
  }
  return attn_proj_(reshape(y, {batch * tokens, width_}));
}

Var GptBlock::mlp(const Var& h) {
  Var a = fc_(h);
  {
    ModuleScope scope(gelu_path_.c_str());
    a = activation(a, gelu_);
  }
  return mlp_proj_(a);
}

Var GptBlock::forward(const Var& x, int64_t batch, int64_t tokens) {
  const Var after_attn = add(x, attention(ln_1_(x), batch, tokens));
  return add(after_attn, mlp(ln_2_(after_attn)));
}

std::vector<std::pair<std::string, Var>> GptBlock::named_parameters() const {
  std::vector<std::pair<std::string, Var>> out;
  auto take = [&](const Module& m) {
    for (auto& p : m.named_parameters()) out.push_back(p);
  };
  take(ln_1_);
  take(q_);
  take(k_);
  take(v_);
  take(attn_proj_);
  take(ln_2_);
  take(fc_);
  take(mlp_proj_);
  return out;
}

void GptBlock::set_working_dtype(DType dtype) {
  for (Linear* l : {&q_, &k_, &v_, &attn_proj_, &fc_, &mlp_proj_}) l->set_working_dtype(dtype);
}

Gpt::Gpt(const GptConfig& config, Rng& rng, Device device)
    : config_((config.validate(), config)),
      wte_(config.vocab, config.width, rng, device, "wte."),
      wpe_(config.context, config.width, rng, device, "wpe."),
      ln_f_(config.width, 1e-5f, device, "ln_f.") {
  for (int i = 0; i < config.layers; ++i) blocks_.push_back(std::make_unique<GptBlock>(config, i, rng, device));
}

Var Gpt::forward(const Var& ids) {
  if (!ids.defined() || ids.shape().rank() != 2)
    throw UsageError("gpt: expects token ids [B, T], got " + (ids.defined() ? ids.value().describe() : "nothing"));
  const int64_t batch = ids.shape()[0], tokens = ids.shape()[1];
  if (tokens > config_.context)
    throw UsageError("gpt: " + std::to_string(tokens) + " tokens do not fit the context of " +
                     std::to_string(config_.context));
  Tensor positions = Tensor::empty(Shape{tokens}, DType::F32, Device::cpu());
  for (int64_t t = 0; t < tokens; ++t) positions.data_as<float>()[t] = static_cast<float>(t);
  if (!ids.device().is_cpu()) positions = positions.to(ids.device());
  // [B, T, D] + [T, D]: every sequence gets the same position rows.
  Var x = add(wte_(ids), wpe_(Var(positions)));
  x = reshape(x, {batch * tokens, config_.width});
  for (auto& block : blocks_) x = block->forward(x, batch, tokens);
  x = ln_f_(x);
  ModuleScope scope("head");
  return linear(x, wte_.weight, Var());  // tied: logits = x wte^T
}

std::vector<std::pair<std::string, Var>> Gpt::named_parameters() const {
  std::vector<std::pair<std::string, Var>> out = wte_.named_parameters();
  for (auto& p : wpe_.named_parameters()) out.push_back(p);
  for (const auto& block : blocks_)
    for (auto& p : block->named_parameters()) out.push_back(p);
  for (auto& p : ln_f_.named_parameters()) out.push_back(p);
  return out;
}

void Gpt::set_working_dtype(DType dtype) {
  for (auto& block : blocks_) block->set_working_dtype(dtype);
}

}  // namespace belay
