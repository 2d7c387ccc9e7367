// Training a byte-level BPE (apps/text/bpe.h: train_bpe). The text is counted once as
// distinct pieces with their counts; each merge then touches only the pieces that hold its
// pair (a list per pair), and the pair counts change only around the merged positions.
// The most frequent pair comes from a max-queue checked lazily: after a pair first appears its
// count can only fall (a merge makes pairs with the new token alone), so a queued count that
// is no longer current is put back with the current one, and the first current one on top is
// the maximum.
#include <algorithm>
#include <queue>
#include <unordered_set>

#include "apps/text/bpe.h"
#include "apps/text/byte_alphabet.h"
#include "apps/text/pretokenize.h"
#include "engine/error.h"

namespace belay {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t left_of(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct Piece {
  std::vector<int32_t> ids;
  int64_t count;
};

struct Queued {
  int64_t count;
  uint64_t pair;
  // The top is the largest count; among equal counts the smallest (left, right).
  bool operator<(const Queued& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

class Trainer {
 public:
  explicit Trainer(std::string_view text) {
    std::unordered_map<std::string_view, int64_t> counts;
    pretokenize(text, [&](std::string_view p) { ++counts[p]; });
    // The pieces in byte order: the same indices on every machine, whatever the hash.
    std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
    std::sort(sorted.begin(), sorted.end());
    pieces_.reserve(sorted.size());
    for (const auto& [bytes, count] : sorted) {
      Piece p{{}, count};
      for (char c : bytes) p.ids.push_back(static_cast<uint8_t>(c));
      pieces_.push_back(std::move(p));
    }
    for (size_t w = 0; w < pieces_.size(); ++w) {
      const auto& ids = pieces_[w].ids;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const uint64_t key = pair_key(ids[i], ids[i + 1]);
        pair_count_[key] += pieces_[w].count;
        holders_[key].push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [key, count] : pair_count_) queue_.push({count, key});
    for (int b = 0; b < 256; ++b) {
      token_bytes_.emplace_back(1, static_cast<char>(b));
      known_.insert(token_bytes_.back());
    }
  }

  // The next merge's pair, or false when no pair is left.
  bool best_pair(uint64_t& pair) {
    while (!queue_.empty()) {
      const Queued top = queue_.top();
      queue_.pop();
      const int64_t now = pair_count_[top.pair];
      if (now != top.count) {
        if (now > 0) queue_.push({now, top.pair});
        continue;
      }
      if (now <= 0) continue;
      // A pair whose bytes are a token already (made from another pair) is never merged.
      if (known_.count(token_bytes_[left_of(top.pair)] + token_bytes_[right_of(top.pair)])) continue;
      pair = top.pair;
      return true;
    }
    return false;
  }

  void merge(uint64_t pair) {
    const int32_t left = left_of(pair), right = right_of(pair);
    const auto made = static_cast<int32_t>(token_bytes_.size());
    token_bytes_.push_back(token_bytes_[left] + token_bytes_[right]);
    known_.insert(token_bytes_.back());
    merges_.emplace_back(left, right);
    std::vector<int32_t> holders = std::move(holders_[pair]);
    holders_.erase(pair);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    std::unordered_set<uint64_t> fresh;  // the pairs with the new token
    for (int32_t w : holders) merge_in_piece(pieces_[w], w, left, right, made, fresh);
    // In key order: the queue's order is total, but a fixed push order costs nothing.
    std::vector<uint64_t> keys(fresh.begin(), fresh.end());
    std::sort(keys.begin(), keys.end());
    for (uint64_t key : keys)
      if (pair_count_[key] > 0) queue_.push({pair_count_[key], key});
  }

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<std::string> token_bytes_;

 private:
  // Replaces each (left, right) in the piece by `made`, left to right. Every old pair touching
  // a replaced position is gone; every new pair touching `made` is new; the rest stay.
  void merge_in_piece(Piece& p, int32_t w, int32_t left, int32_t right, int32_t made,
                      std::unordered_set<uint64_t>& fresh) {
    std::vector<int32_t>& ids = p.ids;
    const size_t n = ids.size();
    std::vector<int32_t> out;
    out.reserve(n);
    size_t last_lost = SIZE_MAX;  // the old pair (by its first position) last taken away
    const auto lose = [&](size_t i) {
      if (i == last_lost) return;
      pair_count_[pair_key(ids[i], ids[i + 1])] -= p.count;
      last_lost = i;
    };
    bool any = false;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && ids[i] == left && ids[i + 1] == right) {
        if (i > 0) lose(i - 1);
        lose(i);
        if (i + 2 < n) lose(i + 1);
        out.push_back(made);
        i += 2;
        any = true;
      } else {
        out.push_back(ids[i++]);
      }
    }
    if (!any) return;  // a stale entry of the pair's list
    for (size_t j = 0; j < out.size(); ++j) {
      if (out[j] != made) continue;
      const auto gain = [&](uint64_t key) {
        pair_count_[key] += p.count;
        holders_[key].push_back(w);
        fresh.insert(key);
      };
      if (j > 0 && out[j - 1] != made) gain(pair_key(out[j - 1], made));
      if (j + 1 < out.size()) gain(pair_key(made, out[j + 1]));
    }
    ids = std::move(out);
  }

  std::vector<Piece> pieces_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> holders_;  // pieces that hold (or held) the pair
  std::priority_queue<Queued> queue_;
  std::unordered_set<std::string> known_;  // every token's bytes
};

}  // namespace

BpeTokenizer train_bpe(std::string_view text, int64_t merges) {
  constexpr int64_t kMaxMerges = (int64_t{1} << 24) - 256;  // ids stay below 2^24 (a tokens file's limit)
  if (merges < 0 || merges > kMaxMerges)
    throw UsageError("train_bpe: merges must be in 0.." + std::to_string(kMaxMerges) + ", got " + std::to_string(merges));
  Trainer t(text);
  for (int64_t m = 0; m < merges; ++m) {
    uint64_t pair = 0;
    if (!t.best_pair(pair))
      throw UsageError("train_bpe: the text has no pair left to merge after " + std::to_string(m) + " merges (" +
                       std::to_string(merges) + " asked for): give more text or fewer merges");
    t.merge(pair);
  }
  std::vector<std::string> vocab;
  vocab.reserve(t.token_bytes_.size());
  for (const std::string& bytes : t.token_bytes_) vocab.push_back(bytes_to_alphabet(bytes));
  return BpeTokenizer(std::move(vocab), t.merges_, {}, "train_bpe");
}

}  // namespace belay
