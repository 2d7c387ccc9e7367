#include "apps/run/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <sstream>

#include "amp/checkpoint.h"
#include "apps/run/model_kinds.h"
#include "apps/run/token_dataset.h"
#include "apps/run/utf8_chunks.h"
#include "autograd/gpt_decode.h"
#include "autograd/graph.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"

namespace belay {

namespace {

void check_options(const SampleConfig& c) {
  if (c.prompt.empty()) throw UsageError("sample: --prompt is empty: give the text to continue, e.g. --prompt \"def \"");
  if (c.tokens < 1) throw UsageError("sample: --tokens must be at least 1, got " + std::to_string(c.tokens));
  if (!(std::isfinite(c.temperature) && c.temperature >= 0.0)) {
    std::ostringstream t;
    t << c.temperature;
    throw UsageError("sample: --temperature must be a finite number >= 0 (0: the most likely token), got " + t.str());
  }
  if (c.top_k < 0) throw UsageError("sample: --top-k must be >= 0 (0: every token), got " + std::to_string(c.top_k));
}

// Uniform in [0, 1) with 53 random bits: every double the draw can need.
double uniform53(Rng& rng) { return static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53; }

// The reference: the logits of the last position of the window (the last `context` ids), from
// forward on the whole window.
std::vector<float> window_logits(Gpt& model, const std::vector<int32_t>& ids) {
  const int64_t t = std::min<int64_t>(static_cast<int64_t>(ids.size()), model.config().context);
  const std::vector<float> window(ids.end() - t, ids.end());  // ids as FP32, as the model reads them
  const std::vector<float> all = model.forward(Var(Tensor::from_vector(window, Shape{1, t}))).value().to_vector();
  return std::vector<float>(all.end() - model.config().vocab, all.end());
}

// The same logits through the cache: the newest id alone when the cache holds every id before
// it from position 0; else (the first call, or a window that has slid, which moves every
// position) the whole window again from an empty cache.
std::vector<float> cached_logits(Gpt& model, KvCache& cache, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), t = std::min(n, model.config().context);
  if (n > model.config().context || cache.length() != n - 1) cache.clear();
  const int64_t fresh = cache.length() == 0 ? t : 1;
  const std::vector<float> tail(ids.end() - fresh, ids.end());
  return model.forward_cached(Var(Tensor::from_vector(tail, Shape{1, fresh})), cache).value().to_vector();
}

}  // namespace

std::unique_ptr<Gpt> load_gpt_checkpoint(const std::string& path) {
  const SafetensorsFile file = read_safetensors(path);
  const Settings s = model_file_settings(file);  // a checkpoint or a model file; throws for anything else
  const std::string model = s.count("model") ? s.at("model") : "";
  const ModelKind* kind = find_model_kind(model);
  if (!kind || !kind->token_data)
    throw UsageError("checkpoint '" + path + "' is of a " + (model.empty() ? std::string("unnamed") : model) +
                     " model, not a GPT: give one written by belay train --model gpt or belay import");
  std::unique_ptr<Module> module = model_from_settings(s, path, Device::cpu());
  Gpt* raw = dynamic_cast<Gpt*>(module.get());
  if (!raw) throw UsageError("checkpoint '" + path + "' holds a " + model + ", which sample cannot run");
  module.release();
  std::unique_ptr<Gpt> gpt_model(raw);
  load_initial_weights(file, *gpt_model);
  return gpt_model;
}

int32_t pick_token(const float* logits, int64_t vocab, double temperature, int64_t top_k, Rng& rng) {
  for (int64_t j = 0; j < vocab; ++j)
    if (!std::isfinite(logits[j]))
      throw Error("sample: the model's logit for token " + std::to_string(j) + " is not finite (" +
                  std::to_string(logits[j]) + "): the checkpoint's weights are broken");
  // Ids by logit, largest first, ties to the lowest id: the argmax is order[0].
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (temperature == 0.0) return order[0];
  const size_t k = top_k > 0 ? static_cast<size_t>(std::min(top_k, vocab)) : order.size();
  std::vector<double> weight(k);
  const double top = logits[order[0]];
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) sum += weight[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / temperature);
  // The first id whose cumulative weight passes u * sum; the top id's weight is 1, so sum >= 1.
  const double target = uniform53(rng) * sum;
  double cum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    cum += weight[i];
    if (cum > target) return order[i];
  }
  return order[0];  // rounding left target at the sum: the likeliest id (weight 1) stands in
}

std::vector<int32_t> generate(Gpt& model, const std::vector<int32_t>& prompt, int64_t count, double temperature,
                              int64_t top_k, uint64_t seed, bool kv_cache,
                              const std::function<void(int32_t)>& on_token) {
  const GptConfig& g = model.config();
  if (prompt.empty()) throw UsageError("sample: the prompt has no tokens");
  for (int32_t id : prompt)
    if (id < 0 || id >= g.vocab)
      throw UsageError("sample: prompt token " + std::to_string(id) + " is not in the model's vocabulary of " +
                       std::to_string(g.vocab) + " tokens");
  NoGrad no_grad;
  Rng rng(seed);
  std::vector<int32_t> ids = prompt, out;
  KvCache cache(g, 1);
  for (int64_t n = 0; n < count; ++n) {
    const std::vector<float> logits = kv_cache ? cached_logits(model, cache, ids) : window_logits(model, ids);
    const int32_t next = pick_token(logits.data(), g.vocab, temperature, top_k, rng);
    ids.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

namespace {

// The prompt as the model's tokens: its tokenizer's, or bytes for a byte-level model.
std::vector<int32_t> prompt_tokens(const SampleConfig& c, const BpeTokenizer* tokenizer, int64_t vocab) {
  if (tokenizer) return tokenizer->encode(c.prompt);  // any bytes: a byte-level BPE has a token for each
  if (vocab > 256)
    throw UsageError("sample: checkpoint '" + c.checkpoint + "' has a vocabulary of " + std::to_string(vocab) +
                     " tokens and no tokenizer: make its data with belay bpe (the tokenizer travels in the file)");
  const std::vector<int32_t> prompt = bytes_to_tokens(c.prompt);
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] >= vocab)
      throw UsageError("sample: prompt byte " + std::to_string(i) + " (value " + std::to_string(prompt[i]) +
                       ") is not in the model's vocabulary of " + std::to_string(vocab) + " tokens");
  return prompt;
}

}  // namespace

void sample_stream(const SampleConfig& c, const std::function<void(const std::string&)>& emit) {
  check_options(c);
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(c.checkpoint);
  const std::shared_ptr<const BpeTokenizer> tokenizer =
      recorded_bpe_tokenizer(read_safetensors(c.checkpoint).metadata(), c.checkpoint);
  if (tokenizer && tokenizer->vocab_size() != model->config().vocab)
    throw UsageError("sample: checkpoint '" + c.checkpoint + "' has a tokenizer of " +
                     std::to_string(tokenizer->vocab_size()) + " tokens for a model of " +
                     std::to_string(model->config().vocab));
  const std::vector<int32_t> prompt = prompt_tokens(c, tokenizer.get(), model->config().vocab);
  Utf8Chunks chunks;  // the prompt too: it may end inside a character that the model finishes
  auto put = [&](const std::string& bytes) {
    const std::string ready = chunks.push(bytes);
    if (!ready.empty()) emit(ready);
  };
  put(c.prompt);
  generate(*model, prompt, c.tokens, c.temperature, c.top_k, c.seed, c.kv_cache, [&](int32_t id) {
    put(tokenizer ? tokenizer->token_bytes(id) : std::string(1, static_cast<char>(id)));
  });
  const std::string rest = chunks.finish();
  if (!rest.empty()) emit(rest);
}

std::string sample_text(const SampleConfig& c) {
  std::string text;
  sample_stream(c, [&](const std::string& bytes) { text += bytes; });
  return text;
}

}  // namespace belay
