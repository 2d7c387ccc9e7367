// Token data for a language model (the GPT, docs/gpt-data.md): the training split of a tokens
// file drawn as windows of context + 1 tokens at seeded random offsets, and its held-out
// split read in a fixed order. Batches are the Dataset's: x [B, T] token ids and y [B, T] the
// next ids, both held as FP32 (exact below 2^24, as cross_entropy's class labels are), so the
// Trainer's row slicing (data parallel, accumulation) works on them unchanged.
// The file: apps/data/make_text_corpus.py writes it; docs/gpt-data.md gives its format.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/run/dataset.h"
#include "apps/text/bpe_source.h"

namespace belay {

inline constexpr const char* kTokensFormat = "belay.tokens.v1";  // metadata "tokens.format"
// A tokens file of BPE ids carries its tokenizer as kBpeMetadataKey (apps/text/bpe_source.h).

class TokenDataset final : public Dataset {
 public:
  // Ids in [0, vocab) (vocab <= 2^24); each split must hold one window (context + 1 ids).
  // `name` stands for the file in errors and in describe(). Throws UsageError otherwise.
  TokenDataset(std::vector<int32_t> train, std::vector<int32_t> heldout, int64_t vocab, int64_t context,
               uint64_t seed, std::string name);

  // Training window n (the n-th drawn, counting from 0) starts at window_start(n): a
  // function of (seed, n) alone, so the position is the count of windows drawn.
  Batch next(int64_t batch, Device device) override;
  int64_t in_features() const override { return context_; }  // T
  int64_t out_features() const override { return vocab_; }   // the classes: the vocabulary
  bool classification() const override { return true; }
  std::string position() const override;                      // "tokens.v1 seed S windows N"
  void set_position(const std::string& position) override;    // refuses another seed's position
  std::string describe() const override;                      // names the split sizes and their CRC-32C

  int64_t vocab() const { return vocab_; }
  int64_t context() const { return context_; }
  const std::vector<int32_t>& train_ids() const { return train_; }
  const std::vector<int32_t>& heldout_ids() const { return heldout_; }
  int64_t window_start(int64_t n) const;

  // Held-out window w is ids [w T, w T + T] of the held-out split: consecutive windows
  // predict consecutive ids, each once. Batch of windows [first, first + count).
  int64_t heldout_windows() const { return (static_cast<int64_t>(heldout_.size()) - 1) / context_; }
  Batch heldout_batch(int64_t first, int64_t count, Device device) const;

  // The unigram entropy of the training split in nats per token: the loss of a model that
  // ignores context, which a language model's held-out loss must fall well below.
  double unigram_entropy_nats() const;

  // The BPE the ids are tokens of; nullptr for byte tokens (or ids of no recorded tokenizer).
  const BpeTokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::shared_ptr<const BpeTokenizer>& shared_tokenizer() const { return tokenizer_; }
  void set_tokenizer(std::shared_ptr<const BpeTokenizer> tokenizer);  // UsageError unless its vocabulary is the file's
  // The bytes of text per token among the targets of the first `windows` held-out windows:
  // 1 for byte tokens, the tokens' own lengths for a BPE, 0 when the ids have no recorded text
  // (I64 ids above 256 without a tokenizer). nats per token / ln 2 / this = bits per byte, the
  // unit that compares models of different tokenizers.
  double heldout_bytes_per_token(int64_t windows) const;

 private:
  Batch windows(const std::vector<int32_t>& ids, const std::vector<int64_t>& starts, Device device) const;

  std::vector<int32_t> train_, heldout_;
  int64_t vocab_, context_;
  uint64_t seed_, key_;
  std::string name_;
  std::shared_ptr<const BpeTokenizer> tokenizer_;
  uint32_t crc_ = 0;    // of both splits' ids, for describe(): a resume on other data is refused
  int64_t drawn_ = 0;  // the position: training windows n < drawn_ have been drawn
};

// The held-out windows in order, `batch` at a time (the last batch may be smaller), at most
// `max_windows` of them (-1: all): every evaluation sees the same windows.
class HeldOutBatches {
 public:
  HeldOutBatches(const TokenDataset& data, int64_t batch, int64_t max_windows = -1);
  std::optional<Batch> next(Device device);  // nothing once all are given
  int64_t windows() const { return end_; }   // how many it walks in all
  void reset() { at_ = 0; }

 private:
  const TokenDataset& data_;
  int64_t batch_, end_, at_ = 0;
};

// A tokens file: 1-D tensors `train` and `heldout` of U8 (byte tokens) or I64 ids, and
// metadata tokens.vocab (and tokens.format, kTokensFormat). Errors name the file and say
// what is wrong: a missing tensor or key, a wrong dtype or shape, an id >= vocab, a split
// shorter than context + 1.
std::unique_ptr<TokenDataset> load_token_dataset(const std::string& path, int64_t context, uint64_t seed);

// Byte-level tokens: a prompt as ids, and ids (< 256) back as bytes (belay sample).
std::vector<int32_t> bytes_to_tokens(const std::string& text);
std::string tokens_to_bytes(const std::vector<int32_t>& ids);

}  // namespace belay
