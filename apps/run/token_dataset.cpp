#include "apps/run/token_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"
#include "engine/text_fields.h"

namespace belay {
namespace {

constexpr int64_t kMaxVocab = int64_t{1} << 24;  // ids are held as FP32: exact below 2^24
constexpr uint64_t kWindowTag = 0x6e776f74;      // "town": keeps the window stream apart from others
constexpr const char* kPositionPrefix = "tokens.v1 seed ";

[[noreturn]] void bad_id(const std::string& name, const char* split, int64_t id, size_t at, int64_t vocab) {
  throw UsageError("tokens '" + name + "': id " + std::to_string(id) + " at " + std::to_string(at) + " of the " +
                   split + " split is not in [0, " + std::to_string(vocab) + "), the vocabulary (tokens.vocab)");
}

// Ids in [0, vocab) and a window's worth of them, or a one-line error naming the split.
void check_ids(const std::string& name, const char* split, const std::vector<int32_t>& ids, int64_t vocab,
               int64_t context) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab) bad_id(name, split, ids[i], i, vocab);
  if (static_cast<int64_t>(ids.size()) < context + 1)
    throw UsageError("tokens '" + name + "': the " + split + " split has " + std::to_string(ids.size()) +
                     " tokens, fewer than a window of context + 1 = " + std::to_string(context + 1) +
                     "; use a shorter context or make the file with a larger --cap");
}

// A split's ids from the file: a 1-D U8 or I64 tensor (the constructor checks them again).
std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& path, const char* split, int64_t vocab) {
  const SafetensorsEntry& e = f.entry(split);  // throws naming the missing tensor
  if (e.shape.size() != 1)
    throw UsageError("tokens file '" + path + "': tensor '" + split + "' must be 1-D (the ids in order)");
  std::vector<int32_t> ids(static_cast<size_t>(e.shape[0]));
  if (e.dtype == "U8") {
    const std::vector<uint8_t> v = f.uint8s(split);
    for (size_t i = 0; i < v.size(); ++i) ids[i] = v[i];
  } else if (e.dtype == "I64") {
    const std::vector<int64_t> v = f.int64s(split);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || v[i] >= vocab) bad_id(path, split, v[i], i, vocab);  // before narrowing it
      ids[i] = static_cast<int32_t>(v[i]);
    }
  } else {
    throw UsageError("tokens file '" + path + "': tensor '" + split + "' has dtype " + e.dtype +
                     "; token ids must be U8 (byte tokens) or I64");
  }
  return ids;
}

}  // namespace

TokenDataset::TokenDataset(std::vector<int32_t> train, std::vector<int32_t> heldout, int64_t vocab, int64_t context,
                           uint64_t seed, std::string name)
    : train_(std::move(train)),
      heldout_(std::move(heldout)),
      vocab_(vocab),
      context_(context),
      seed_(seed),
      key_(stream_seed(seed, kWindowTag)),
      name_(std::move(name)) {
  if (vocab < 1 || vocab > kMaxVocab)
    throw UsageError("tokens '" + name_ + "': vocabulary size " + std::to_string(vocab) + " is not in [1, 2^24]");
  if (context < 1) throw UsageError("tokens '" + name_ + "': the context must be >= 1 token");
  check_ids(name_, "train", train_, vocab, context);
  check_ids(name_, "held-out", heldout_, vocab, context);
  crc_ = crc32c(train_.data(), train_.size() * sizeof(int32_t));
  crc_ = crc32c(heldout_.data(), heldout_.size() * sizeof(int32_t), crc_);
}

// Uniform in [0, train - context) (every start whose window of context + 1 ids fits): the
// first word of the generator seeded by (seed, n), scaled by a 64x64 -> 128-bit product
// (no modulo; a bias below 2^-40 for any split this holds in memory).
int64_t TokenDataset::window_start(int64_t n) const {
  const uint64_t starts = train_.size() - static_cast<uint64_t>(context_);
  Rng rng(mix64(key_ + static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ull));
  return static_cast<int64_t>((static_cast<unsigned __int128>(rng.next_u64()) * starts) >> 64);
}

// x [B, T] = ids [s, s + T) and y [B, T] = ids [s + 1, s + T] of each start s, as FP32.
Batch TokenDataset::windows(const std::vector<int32_t>& ids, const std::vector<int64_t>& starts, Device device) const {
  const int64_t b = static_cast<int64_t>(starts.size()), t = context_;
  Batch out{Tensor::empty(Shape{b, t}), Tensor::empty(Shape{b, t})};
  float* x = out.x.data_as<float>();
  float* y = out.y.data_as<float>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < t; ++j) {
      x[r * t + j] = static_cast<float>(ids[static_cast<size_t>(starts[r] + j)]);
      y[r * t + j] = static_cast<float>(ids[static_cast<size_t>(starts[r] + j + 1)]);
    }
  if (!device.is_cpu()) out = {out.x.to(device), out.y.to(device)};
  return out;
}

Batch TokenDataset::next(int64_t batch, Device device) {
  if (batch < 1) throw UsageError("tokens '" + name_ + "': a batch needs at least one window");
  std::vector<int64_t> starts(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) starts[r] = window_start(drawn_ + r);
  Batch b = windows(train_, starts, device);
  drawn_ += batch;
  return b;
}

Batch TokenDataset::heldout_batch(int64_t first, int64_t count, Device device) const {
  if (first < 0 || count < 1 || first + count > heldout_windows())
    throw UsageError("tokens '" + name_ + "': held-out windows [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") are not within the " + std::to_string(heldout_windows()) +
                     " the held-out split has");
  std::vector<int64_t> starts(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) starts[r] = (first + r) * context_;
  return windows(heldout_, starts, device);
}

std::string TokenDataset::position() const {
  return kPositionPrefix + std::to_string(seed_) + " windows " + std::to_string(drawn_);
}

void TokenDataset::set_position(const std::string& p) {
  const std::string prefix = kPositionPrefix, mid = " windows ";
  const size_t at = p.rfind(prefix, 0) == 0 ? p.find(mid, prefix.size()) : std::string::npos;
  const std::string seed = at == std::string::npos ? "" : p.substr(prefix.size(), at - prefix.size());
  const int64_t windows = at == std::string::npos ? -1 : parse_count(p.substr(at + mid.size())).value_or(-1);
  if (seed.empty() || seed.size() > 20 || seed.find_first_not_of("0123456789") != std::string::npos || windows < 0)
    throw UsageError("token data position '" + p + "' is not '" + prefix + "S windows N'");
  if (seed != std::to_string(seed_))
    throw UsageError("token data position '" + p + "' was drawn with seed " + seed + ", this data has seed " +
                     std::to_string(seed_) + ": resume with the run's own seed");
  drawn_ = windows;
}

std::string TokenDataset::describe() const {
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc_);
  return "'" + name_ + "' (tokens: vocab " + std::to_string(vocab_) + ", train " + std::to_string(train_.size()) +
         ", held-out " + std::to_string(heldout_.size()) + ", crc32c " + crc + ", context " +
         std::to_string(context_) + ")";
}

double TokenDataset::unigram_entropy_nats() const {
  std::vector<int64_t> counts(static_cast<size_t>(vocab_), 0);
  for (int32_t id : train_) ++counts[static_cast<size_t>(id)];
  const double n = static_cast<double>(train_.size());
  double h = 0.0;  // summed over ids in order: the same bits every time
  for (int64_t c : counts)
    if (c > 0) h -= static_cast<double>(c) / n * std::log(static_cast<double>(c) / n);
  return h;
}

HeldOutBatches::HeldOutBatches(const TokenDataset& data, int64_t batch, int64_t max_windows)
    : data_(data), batch_(batch), end_(data.heldout_windows()) {
  if (batch < 1) throw UsageError("held-out batches need a batch of at least one window");
  if (max_windows >= 0 && max_windows < end_) end_ = max_windows;
}

std::optional<Batch> HeldOutBatches::next(Device device) {
  if (at_ >= end_) return std::nullopt;
  const int64_t count = std::min(batch_, end_ - at_);
  Batch b = data_.heldout_batch(at_, count, device);
  at_ += count;
  return b;
}

std::unique_ptr<TokenDataset> load_token_dataset(const std::string& path, int64_t context, uint64_t seed) {
  const SafetensorsFile f = read_safetensors(path);  // layout and belay's checksums
  const auto& meta = f.metadata();
  const auto format = meta.find("tokens.format");
  if (format != meta.end() && format->second != kTokensFormat)
    throw UsageError("tokens file '" + path + "' is format '" + format->second + "'; this belay reads " +
                     kTokensFormat + " (make it again with apps/data/make_text_corpus.py)");
  const auto vocab = meta.find("tokens.vocab");
  const int64_t v = vocab == meta.end() ? 0 : parse_count(vocab->second).value_or(0);  // the constructor refuses one above 2^24
  if (v < 1)
    throw UsageError("tokens file '" + path + "': metadata needs tokens.vocab, the vocabulary size (256 for bytes)");
  auto data = std::make_unique<TokenDataset>(read_ids(f, path, "train", v), read_ids(f, path, "heldout", v), v,
                                             context, seed, path);
  if (auto tokenizer = recorded_bpe_tokenizer(meta, path)) data->set_tokenizer(std::move(tokenizer));
  return data;
}

void TokenDataset::set_tokenizer(std::shared_ptr<const BpeTokenizer> tokenizer) {
  if (tokenizer && tokenizer->vocab_size() != vocab_)
    throw UsageError("tokens '" + name_ + "': its tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                     " tokens, the file's vocabulary " + std::to_string(vocab_));
  tokenizer_ = std::move(tokenizer);
}

double TokenDataset::heldout_bytes_per_token(int64_t windows) const {
  if (!tokenizer_ && vocab_ > 256) return 0.0;
  const int64_t targets = std::min(windows, heldout_windows()) * context_;
  if (targets <= 0) return 0.0;
  if (!tokenizer_) return 1.0;
  double bytes = 0.0;
  for (int64_t i = 1; i <= targets; ++i) bytes += static_cast<double>(tokenizer_->token_bytes(heldout_[i]).size());
  return bytes / static_cast<double>(targets);
}

std::vector<int32_t> bytes_to_tokens(const std::string& text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string tokens_to_bytes(const std::vector<int32_t>& ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255)
      throw Error("token " + std::to_string(ids[i]) + " is not a byte: these are not byte-level tokens");
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

}  // namespace belay
