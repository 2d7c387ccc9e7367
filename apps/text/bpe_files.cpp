// BpeTokenizer and Hugging Face's files: vocab.json + merges.txt (GPT-2's own pair) and
// tokenizer.json (`tokenizers`' one-file form), read with every problem named in one line, and
// written atomically (apps/text/bpe.h).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include "apps/text/bpe.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/text_file.h"

namespace belay {
namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string text = read_text_file(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": not valid JSON (" + one_line(e.what()) + ")");
  }
}

// id -> token, from vocab.json's object (token -> id); the ids must be 0..N-1, each once.
// `extra`: tokens with their ids to add (tokenizer.json's added tokens).
std::vector<std::string> vocab_by_id(const nlohmann::json& vocab, const std::string& where,
                                     const std::vector<std::pair<int64_t, std::string>>& extra = {}) {
  if (!vocab.is_object()) throw UsageError(where + ": the vocabulary is not a JSON object (token -> id)");
  std::map<int64_t, std::string> by_id;
  const auto add = [&](int64_t id, const std::string& token, bool added) {
    if (id < 0 || id >= (int64_t{1} << 30)) throw UsageError(where + ": token '" + token + "' has id " + std::to_string(id) + ", out of range");
    const auto [at, fresh] = by_id.emplace(id, token);
    if (!fresh && !(added && at->second == token))
      throw UsageError(where + ": id " + std::to_string(id) + " is given to both '" + at->second + "' and '" + token + "'");
  };
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) throw UsageError(where + ": the id of token '" + token + "' is not an integer");
    add(id.get<int64_t>(), token, false);
  }
  for (const auto& [id, token] : extra) add(id, token, true);
  std::vector<std::string> tokens;
  tokens.reserve(by_id.size());
  for (const auto& [id, token] : by_id) {
    if (id != static_cast<int64_t>(tokens.size()))
      throw UsageError(where + ": no token has id " + std::to_string(tokens.size()) + " (the ids must be 0..N-1)");
    tokens.push_back(token);
  }
  return tokens;
}

// "left right" (merges.txt's lines, and tokenizer.json's older form) or ["left", "right"] as ids.
class MergeReader {
 public:
  MergeReader(const std::vector<std::string>& tokens) {
    for (size_t id = 0; id < tokens.size(); ++id) index_.emplace(tokens[id], static_cast<int32_t>(id));
  }
  void add(const std::string& left, const std::string& right, const std::string& where) {
    merges.emplace_back(id(left, where), id(right, where));
  }
  void add_line(std::string_view line, const std::string& where) {
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      throw UsageError(where + ": '" + std::string(line) + "' is not two tokens separated by one space");
    add(std::string(line.substr(0, space)), std::string(line.substr(space + 1)), where);
  }
  std::vector<std::pair<int32_t, int32_t>> merges;

 private:
  int32_t id(const std::string& token, const std::string& where) const {
    const auto it = index_.find(token);
    if (it == index_.end()) throw UsageError(where + ": token '" + token + "' is not in the vocabulary");
    return it->second;
  }
  std::unordered_map<std::string, int32_t> index_;
};

void require(bool ok, const std::string& path, const std::string& what) {
  if (!ok) throw UsageError(path + ": " + what + " (belay reads GPT-2's byte-level BPE only)");
}

bool is_byte_level(const nlohmann::json& j) { return j.is_object() && j.value("type", std::string()) == "ByteLevel"; }

bool null_or_empty(const nlohmann::json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_string() && j[key].get<std::string>().empty());
}

// Everything of tokenizer.json that would make Hugging Face's ids differ from GPT-2's rules.
void check_tokenizer_json_kind(const nlohmann::json& j, const std::string& path) {
  require(j.is_object() && j.contains("model") && j["model"].is_object(), path, "no model object");
  const nlohmann::json& m = j["model"];
  require(m.value("type", std::string()) == "BPE", path, "model type '" + m.value("type", std::string("?")) + "' is not BPE");
  require(!j.contains("normalizer") || j["normalizer"].is_null(), path, "it has a normalizer");
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  require(is_byte_level(pre) && !pre.value("add_prefix_space", false) && pre.value("use_regex", true), path,
          "the pre-tokenizer is not ByteLevel with add_prefix_space false and use_regex true");
  require(is_byte_level(j.value("decoder", nlohmann::json())), path, "the decoder is not ByteLevel");
  const nlohmann::json post = j.value("post_processor", nlohmann::json());
  require(post.is_null() || is_byte_level(post), path, "the post-processor is not ByteLevel (it would add tokens)");
  require(!j.contains("truncation") || j["truncation"].is_null(), path, "it truncates");
  require(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"] == 0, path, "it has BPE dropout");
  require(null_or_empty(m, "continuing_subword_prefix") && null_or_empty(m, "end_of_word_suffix"), path,
          "it has a subword prefix or suffix");
  require(!m.value("ignore_merges", false), path, "ignore_merges is true");
}

}  // namespace

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  std::vector<std::string> tokens = vocab_by_id(read_json_file(vocab_json, "vocabulary"), vocab_json);
  MergeReader reader(tokens);
  const std::string text = read_text_file(merges_txt, "merges file");
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_no;
    at = end + 1;
    if (line.rfind("#version", 0) == 0) continue;
    reader.add_line(line, merges_txt + " line " + std::to_string(line_no));
  }
  return BpeTokenizer(std::move(tokens), reader.merges, {}, merges_txt);
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "tokenizer file");
  check_tokenizer_json_kind(j, path);
  try {
    std::vector<AddedToken> added;
    std::vector<std::pair<int64_t, std::string>> extra;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      const std::string content = a.at("content").get<std::string>();
      require(!a.value("single_word", false) && !a.value("lstrip", false) && !a.value("rstrip", false), path,
              "added token '" + content + "' is single_word, lstrip or rstrip");
      added.push_back({a.at("id").get<int32_t>(), content, a.value("special", false)});
      extra.emplace_back(added.back().id, content);
    }
    std::vector<std::string> tokens = vocab_by_id(j["model"].at("vocab"), path, extra);
    MergeReader reader(tokens);
    size_t n = 0;
    for (const auto& m : j["model"].at("merges")) {
      const std::string where = path + ": merge " + std::to_string(++n);
      if (m.is_string()) reader.add_line(m.get<std::string>(), where);
      else if (m.is_array() && m.size() == 2) reader.add(m[0].get<std::string>(), m[1].get<std::string>(), where);
      else throw UsageError(where + " is neither \"left right\" nor [left, right]");
    }
    return BpeTokenizer(std::move(tokens), reader.merges, std::move(added), path);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": malformed (" + one_line(e.what()) + ")");
  }
}

BpeTokenizer BpeTokenizer::from_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError(dir + ": not a directory");
  const fs::path d(dir);
  if (fs::exists(d / "tokenizer.json", ec)) return from_tokenizer_json((d / "tokenizer.json").string());
  if (fs::exists(d / "vocab.json", ec) && fs::exists(d / "merges.txt", ec))
    return from_files((d / "vocab.json").string(), (d / "merges.txt").string());
  throw UsageError(dir + ": holds neither tokenizer.json nor vocab.json and merges.txt");
}

void BpeTokenizer::write_files(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) throw UsageError(dir + ": cannot make this directory");
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id < vocab_.size(); ++id) vocab[vocab_[id]] = id;
  std::string merges = "#version: 0.2\n";
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& [left, right] : merges_) {
    merge_list.push_back(vocab_[left] + " " + vocab_[right]);
    merges += vocab_[left] + " " + vocab_[right] + "\n";
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const AddedToken& t : added_)
    added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", t.special}});
  const auto byte_level = [](bool prefix, bool trim) {
    return nlohmann::ordered_json{{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", trim}, {"use_regex", true}};
  };
  nlohmann::ordered_json model{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                               {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false}};
  model["vocab"] = vocab;
  model["merges"] = std::move(merge_list);
  nlohmann::ordered_json tokenizer{{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}};
  tokenizer["added_tokens"] = std::move(added);
  tokenizer["normalizer"] = nullptr;
  tokenizer["pre_tokenizer"] = byte_level(false, true);
  tokenizer["post_processor"] = byte_level(true, false);
  tokenizer["decoder"] = byte_level(true, true);
  tokenizer["model"] = std::move(model);
  const fs::path d(dir);
  write_file_atomically((d / "vocab.json").string(), vocab.dump() + "\n");
  write_file_atomically((d / "merges.txt").string(), merges);
  write_file_atomically((d / "tokenizer.json").string(), tokenizer.dump() + "\n");
}

}  // namespace belay
