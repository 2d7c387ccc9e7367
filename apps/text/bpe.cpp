// GPT-2's byte-level BPE: the tables, encoding by merge rank, decoding, and the compact form
// kept in metadata (apps/text/bpe.h). The Hugging Face files: apps/text/bpe_files.cpp;
// training: apps/text/bpe_train.cpp.
#include "apps/text/bpe.h"

#include <nlohmann/json.hpp>

#include <queue>

#include "apps/text/byte_alphabet.h"
#include "apps/text/pretokenize.h"
#include "engine/error.h"

namespace belay {
namespace {

constexpr const char* kSerializedFormat = "belay.bpe.v1";

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string in_quotes(const std::string& token) { return "'" + token + "'"; }

}  // namespace

BpeTokenizer::BpeTokenizer(std::vector<std::string> vocab, const std::vector<std::pair<int32_t, int32_t>>& merges,
                           std::vector<AddedToken> added, const std::string& source)
    : vocab_(std::move(vocab)), merges_(merges), added_(std::move(added)) {
  if (vocab_.size() > (1u << 30)) throw UsageError(source + ": a vocabulary of " + std::to_string(vocab_.size()) + " tokens is too large");
  std::unordered_map<std::string_view, int32_t> index;
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const auto [at, fresh] = index.emplace(vocab_[id], static_cast<int32_t>(id));
    if (!fresh)
      throw UsageError(source + ": token " + in_quotes(vocab_[id]) + " has two ids, " + std::to_string(at->second) +
                       " and " + std::to_string(id));
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = index.find(byte_char(static_cast<uint8_t>(b)));
    if (it == index.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      throw UsageError(source + ": no token for byte " + hex + " (" + in_quotes(byte_char(static_cast<uint8_t>(b))) +
                       "): a byte-level BPE needs all 256 bytes");
    }
    byte_ids_[b] = it->second;
  }
  ranks_.reserve(merges_.size() * 2);
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    const auto [left, right] = merges_[rank];
    const std::string where = source + ": merge " + std::to_string(rank + 1);
    if (left < 0 || right < 0 || left >= vocab_size() || right >= vocab_size())
      throw UsageError(where + " names an id outside the vocabulary (" + std::to_string(vocab_size()) + " tokens)");
    const std::string merged = vocab_[left] + vocab_[right];
    const auto it = index.find(merged);
    if (it == index.end())
      throw UsageError(where + " (" + in_quotes(vocab_[left]) + " " + in_quotes(vocab_[right]) + ") makes " + in_quotes(merged) +
                       ", which is not in the vocabulary");
    const auto [at, fresh] = ranks_.emplace(pair_key(left, right), std::pair{static_cast<int32_t>(rank), it->second});
    if (!fresh)
      throw UsageError(where + " (" + in_quotes(vocab_[left]) + " " + in_quotes(vocab_[right]) + ") repeats merge " +
                       std::to_string(at->second.first + 1));
  }
  for (const AddedToken& t : added_) {
    if (t.id < 0 || t.id >= vocab_size())
      throw UsageError(source + ": added token " + in_quotes(t.content) + " has id " + std::to_string(t.id) +
                       ", outside the vocabulary");
    if (t.content.empty()) throw UsageError(source + ": an added token (id " + std::to_string(t.id) + ") is empty");
  }
  bytes_.reserve(vocab_.size());
  for (const std::string& token : vocab_) bytes_.push_back(alphabet_to_bytes(token));
}

// Hugging Face's merge loop (tokenizers' BPE Word::merge_all), dropout aside: a queue of the
// adjacent pairs that have a merge, lowest rank first and leftmost among equal ranks; a popped
// pair whose symbols have changed since it was queued is dropped.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const auto n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into the symbol on its left
  };
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // a min-queue
  };
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate> queue;
  const auto offer = [&](int32_t pos) {  // the pair starting at symbol `pos`, if it has a merge
    const auto it = ranks_.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
    if (it != ranks_.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& s = sym[top.pos];
    if (s.id < 0 || s.next < 0) continue;
    const auto it = ranks_.find(pair_key(s.id, sym[s.next].id));
    if (it == ranks_.end() || it->second.second != top.merged) continue;  // queued before its symbols changed
    Symbol& right = sym[s.next];
    s.id = top.merged;
    s.next = right.next;
    right.id = -1;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    if (s.prev >= 0) offer(s.prev);
    if (s.next >= 0) offer(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out,
                                std::unordered_map<std::string_view, std::pair<size_t, size_t>>& cache,
                                std::vector<int32_t>& cached) const {
  pretokenize(text, [&](std::string_view piece) {
    auto it = cache.find(piece);
    if (it == cache.end()) {
      const size_t start = cached.size();
      encode_piece(piece, cached);
      it = cache.emplace(piece, std::pair{start, cached.size() - start}).first;
    }
    out.insert(out.end(), cached.begin() + it->second.first, cached.begin() + it->second.first + it->second.second);
  });
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  // Pieces seen in this call (views into `text`) -> their ids in `cached`: text repeats its words.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;
  std::vector<int32_t> cached;
  // Added tokens: at each step the leftmost occurrence of any, the longest among those that
  // start there (Hugging Face's leftmost-longest matching); each token's next occurrence is
  // kept and looked for again only once the text before it has been used.
  constexpr size_t kUnknown = std::string_view::npos - 1;
  std::vector<size_t> next(added_.size(), kUnknown);
  size_t at = 0;
  while (at < text.size()) {
    size_t best = std::string_view::npos, best_len = 0;
    int32_t best_id = -1;
    for (size_t t = 0; t < added_.size(); ++t) {
      if (next[t] == kUnknown || (next[t] != std::string_view::npos && next[t] < at)) next[t] = text.find(added_[t].content, at);
      const size_t len = added_[t].content.size();
      if (next[t] != std::string_view::npos && (next[t] < best || (next[t] == best && len > best_len)))
        best = next[t], best_len = len, best_id = added_[t].id;
    }
    if (best == std::string_view::npos) {
      encode_plain(text.substr(at), out, cache, cached);
      break;
    }
    if (best > at) encode_plain(text.substr(at, best - at), out, cache, cached);
    out.push_back(best_id);
    at = best + best_len;
  }
  return out;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw UsageError("decode: token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                     std::to_string(vocab_size()) + " tokens)");
  return bytes_[id];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string BpeTokenizer::serialized() const {
  nlohmann::ordered_json j;
  j["format"] = kSerializedFormat;
  j["vocab"] = vocab_;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [left, right] : merges_) merges.push_back({left, right});
  j["merges"] = std::move(merges);
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const AddedToken& t : added_) added.push_back({{"id", t.id}, {"content", t.content}, {"special", t.special}});
  j["added"] = std::move(added);
  return j.dump();
}

BpeTokenizer BpeTokenizer::from_serialized(const std::string& text, const std::string& source) {
  const std::string what = source + ": tokens.bpe";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw UsageError(what + " is not a BPE tokenizer (not a JSON object)");
  if (j.value("format", std::string()) != kSerializedFormat)
    throw UsageError(what + " is not in belay's format " + kSerializedFormat);
  try {
    std::vector<std::pair<int32_t, int32_t>> merges;
    for (const auto& m : j.at("merges")) {
      if (!m.is_array() || m.size() != 2) throw UsageError(what + ": a merge is not a pair of ids");
      merges.emplace_back(m[0].get<int32_t>(), m[1].get<int32_t>());
    }
    std::vector<AddedToken> added;
    for (const auto& a : j.at("added"))
      added.push_back({a.at("id").get<int32_t>(), a.at("content").get<std::string>(), a.at("special").get<bool>()});
    return BpeTokenizer(j.at("vocab").get<std::vector<std::string>>(), merges, std::move(added), what);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + " is malformed (" + e.what() + ")");
  }
}

}  // namespace belay
