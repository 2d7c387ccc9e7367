// GPT-2's byte-level BPE: text pre-tokenized (apps/text/pretokenize.h), each piece's bytes
// merged by rank, as Hugging Face `tokenizers` does it, token for token. Loaded from GPT-2's
// files as Hugging Face ships them (vocab.json + merges.txt, or tokenizer.json), trained here
// (train_bpe), and kept in a tokens file's or checkpoint's metadata as one string (serialized).
// docs/bpe.md describes the files and the rules.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace belay {

class BpeTokenizer {
 public:
  // GPT-2's files as Hugging Face ships them. Errors: belay::UsageError with one line naming
  // the file and the problem.
  static BpeTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);
  // model.type "BPE", ByteLevel pre-tokenizer and decoder; its added tokens (<|endoftext|>) are
  // kept and matched in the text. Other kinds are refused in one line.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  // tokenizer.json if present, else vocab.json + merges.txt.
  static BpeTokenizer from_directory(const std::string& dir);
  // The compact form kept in a tokens file's or checkpoint's metadata (tokens.bpe): one JSON
  // string, which from_serialized reads back to the same tokenizer and serialized() writes again
  // byte for byte.
  static BpeTokenizer from_serialized(const std::string& text, const std::string& source_for_errors);
  std::string serialized() const;
  // vocab.json, merges.txt and tokenizer.json (which `tokenizers.Tokenizer.from_file` and
  // transformers' GPT2TokenizerFast load), each written atomically into `dir` (made if missing).
  void write_files(const std::string& dir) const;

  // Bytes in, ids out. The added tokens (tokenizer.json's) are matched first, leftmost and
  // longest, as Hugging Face does; the text between them is pre-tokenized and merged.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids to bytes; an id out of range is a UsageError. decode(encode(x)) == x for all bytes x.
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& token_bytes(int32_t id) const;  // one token's bytes (streaming decode)
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t merges() const { return static_cast<int64_t>(merges_.size()); }

 private:
  struct AddedToken {
    int32_t id;
    std::string content;  // matched in the text as these bytes
    bool special;
  };
  // `vocab`: each id's token in the alphabet's form (apps/text/byte_alphabet.h); `merges`: pairs
  // of ids in rank order. Checks everything; errors name `source`.
  BpeTokenizer(std::vector<std::string> vocab, const std::vector<std::pair<int32_t, int32_t>>& merges,
               std::vector<AddedToken> added, const std::string& source);
  friend BpeTokenizer train_bpe(std::string_view text, int64_t merges);

  // One piece's ids by merge rank, appended to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // Text with no added token in it: pieces, each through a cache of the pieces seen in this call.
  void encode_plain(std::string_view text, std::vector<int32_t>& out,
                    std::unordered_map<std::string_view, std::pair<size_t, size_t>>& cache,
                    std::vector<int32_t>& cached) const;

  std::vector<std::string> vocab_;  // id -> token, in the alphabet's form
  std::vector<std::string> bytes_;  // id -> its bytes
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> ranks_;  // (left, right) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids_{};                               // each byte's single-byte token
  std::vector<AddedToken> added_;
};

// Trains a byte-level BPE on `text`, pre-tokenized as above: ids 0..255 are the single bytes,
// id == byte value (so 0 merges is belay's byte tokens), then `merges` merges, ids 256, 257, ...
// in merge order. Each merge is the most frequent adjacent pair of tokens, counted over the
// pieces (a piece's count times its occurrences in it); ties go to the smallest (left id, right
// id). A pair whose bytes are already a token (reached by another pair) is never merged, so
// every token's bytes are distinct. Deterministic: integer counts, a total order on pairs.
// Fewer pairs left than `merges` asks for: UsageError.
BpeTokenizer train_bpe(std::string_view text, int64_t merges);

}  // namespace belay
