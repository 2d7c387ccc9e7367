// `belay bpe train | tokenize | encode | decode` (apps/cli/bpe_cmd.h): options and wiring; the tokenizer
// is apps/text's.
#include "apps/cli/bpe_cmd.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <vector>

#include "apps/run/token_dataset.h"
#include "apps/text/bpe.h"
#include "apps/text/bpe_source.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/text_fields.h"
#include "engine/text_file.h"

namespace belay {
namespace {

// A U8 split of a byte-level tokens file, as bytes.
std::string byte_split(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry& e = f.entry(name);
  if (e.dtype != "U8" || e.shape.size() != 1)
    throw UsageError(f.source() + ": '" + name + "' is " + e.dtype + " of rank " + std::to_string(e.shape.size()) +
                     "; belay bpe train reads a byte-level tokens file (1-D U8 train and heldout)");
  const std::vector<uint8_t> bytes = f.uint8s(name);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<int64_t> as_int64s(const std::vector<int32_t>& ids) { return std::vector<int64_t>(ids.begin(), ids.end()); }

std::vector<int32_t> parse_ids(const std::vector<std::string>& words) {
  std::vector<int32_t> ids;
  for (const std::string& w : words) {
    const std::optional<int64_t> v = parse_count(w);
    if (!v || *v > INT32_MAX) throw UsageError("bpe decode: '" + w + "' is not a token id");
    ids.push_back(static_cast<int32_t>(*v));
  }
  return ids;
}

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

int run_encode(const BpeCommand& o, std::ostream& out) {
  if ((o.encode->get_option("--text")->count() > 0) == (o.encode->get_option("--file")->count() > 0))
    throw UsageError("bpe encode: give the text with --text STR or --file PATH (one of them)");
  const BpeTokenizer tok = load_bpe_tokenizer(o.tokenizer);
  const std::string text = o.file.empty() ? o.text : read_text_file(o.file, "text file");
  std::string line;
  for (int32_t id : tok.encode(text)) {
    if (!line.empty()) line += ' ';
    line += std::to_string(id);
  }
  out << line << "\n";
  return 0;
}

int run_decode(const BpeCommand& o, std::ostream& out) {
  if (!o.ids.empty() && !o.file.empty()) throw UsageError("bpe decode: give ids or --file PATH, not both");
  const BpeTokenizer tok = load_bpe_tokenizer(o.tokenizer);
  const std::string bytes = tok.decode(parse_ids(o.file.empty() ? o.ids : words_of(read_text_file(o.file, "ids file"))));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct ByteSplits {
  SafetensorsFile file;
  std::string train, heldout;
};

// The byte-level tokens file a BPE is trained on or applied to, checked before anything runs.
ByteSplits read_byte_splits(const std::string& data, const std::string& out, const std::string& save_dir,
                            const char* command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out, ec) && fs::equivalent(out, data, ec))
    throw UsageError(std::string(command) + ": -o " + out + " would overwrite --data");
  SafetensorsFile src = read_safetensors(data);
  if (src.metadata().count(kBpeMetadataKey))
    throw UsageError(data + ": its ids are BPE tokens already (tokens.bpe); belay " + command +
                     " reads a byte-level tokens file");
  std::string train = byte_split(src, "train"), heldout = byte_split(src, "heldout");
  check_writable(out);
  if (!save_dir.empty() && fs::exists(save_dir, ec) && !fs::is_directory(save_dir, ec))
    throw UsageError(std::string(command) + ": --save-dir " + save_dir + " is a file, not a directory");
  return {std::move(src), std::move(train), std::move(heldout)};
}

// Both splits as `tok`'s ids, written to `out` as a tokens file that carries the tokenizer (and
// the source's metadata); the Hugging Face files into `save_dir` when it is given.
void write_bpe_tokens(const ByteSplits& src, const BpeTokenizer& tok, const std::string& out,
                      const std::string& save_dir, const std::string& how, std::ostream& log) {
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<int32_t> train_ids = tok.encode(src.train), heldout_ids = tok.encode(src.heldout);
  const double encode_s = seconds_since(t1);

  std::map<std::string, std::string> meta = src.file.metadata();
  meta.erase(kChecksumKey);
  meta.erase(kHeaderChecksumKey);
  meta["tokens.format"] = kTokensFormat;
  meta["tokens.vocab"] = std::to_string(tok.vocab_size());
  meta["tokens.kind"] = "bpe: ids of the tokenizer in tokens.bpe";
  meta[kBpeMetadataKey] = tok.serialized();
  meta["train.tokens"] = std::to_string(train_ids.size());
  meta["heldout.tokens"] = std::to_string(heldout_ids.size());
  meta["bpe.merges"] = std::to_string(tok.merges());
  meta["bpe.train_bytes"] = std::to_string(src.train.size());
  meta["bpe.heldout_bytes"] = std::to_string(src.heldout.size());
  if (!save_dir.empty()) tok.write_files(save_dir);
  write_safetensors(out, {}, meta, {{"train", as_int64s(train_ids)}, {"heldout", as_int64s(heldout_ids)}});

  char line[512];
  std::snprintf(line, sizeof line,
                "bpe: %lld merges, vocabulary %lld (%s); train %zu bytes -> %zu tokens (%.3f bytes/token), "
                "heldout %zu bytes -> %zu tokens (encoded in %.2f s); wrote %s\n",
                static_cast<long long>(tok.merges()), static_cast<long long>(tok.vocab_size()), how.c_str(),
                src.train.size(), train_ids.size(),
                train_ids.empty() ? 0.0 : double(src.train.size()) / double(train_ids.size()), src.heldout.size(),
                heldout_ids.size(), encode_s, out.c_str());
  log << line;
  if (!save_dir.empty()) log << "bpe: wrote vocab.json, merges.txt and tokenizer.json into " << save_dir << "\n";
}

}  // namespace

int run_bpe_train(const std::string& data, int64_t merges, const std::string& out, const std::string& save_dir,
                  std::ostream& log) {
  const ByteSplits src = read_byte_splits(data, out, save_dir, "bpe train");
  const auto t0 = std::chrono::steady_clock::now();
  const BpeTokenizer tok = train_bpe(src.train, merges);
  char how[64];
  std::snprintf(how, sizeof how, "trained in %.2f s", seconds_since(t0));
  write_bpe_tokens(src, tok, out, save_dir, how, log);
  return 0;
}

int run_bpe_tokenize(const std::string& tokenizer, const std::string& data, const std::string& out, std::ostream& log) {
  const ByteSplits src = read_byte_splits(data, out, "", "bpe tokenize");
  write_bpe_tokens(src, load_bpe_tokenizer(tokenizer), out, "", "from " + tokenizer, log);
  return 0;
}

void add_bpe_commands(CLI::App& app, BpeCommand& o) {
  CLI::App* bpe = app.add_subcommand("bpe", "GPT-2's byte-level BPE tokenizer: train one, tokenize a file, encode, decode");
  bpe->require_subcommand(1);
  o.train = bpe->add_subcommand("train", "train a BPE on a byte-level tokens file and write its ids as a tokens file");
  o.train->add_option("--data", o.data, "the byte-level tokens file (U8 train and heldout; apps/data/make_text_corpus.py)")->required();
  o.train->add_option("--merges", o.merges, "how many merges (the vocabulary is 256 + merges)")->required();
  o.train->add_option("-o,--out", o.out, "the tokens file to write (I64 ids, tokens.bpe in its metadata)")->required();
  o.train->add_option("--save-dir", o.save_dir, "also write vocab.json, merges.txt and tokenizer.json here");
  const auto source_help = "a directory of Hugging Face files, a tokenizer.json, or a tokens file or checkpoint with tokens.bpe";
  o.tokenize = bpe->add_subcommand("tokenize", "a byte-level tokens file as the ids of a tokenizer you have "
                                               "(GPT-2's, to fine-tune an imported model): a tokens file");
  o.tokenize->add_option("--tokenizer", o.tokenizer, source_help)->required();
  o.tokenize->add_option("--data", o.data, "the byte-level tokens file (U8 train and heldout)")->required();
  o.tokenize->add_option("-o,--out", o.out, "the tokens file to write (I64 ids, tokens.bpe in its metadata)")->required();
  o.encode = bpe->add_subcommand("encode", "print the token ids of a text, space-separated");
  o.encode->add_option("--tokenizer", o.tokenizer, source_help)->required();
  o.encode->add_option("--text", o.text, "the text");
  o.encode->add_option("--file", o.file, "the text: this file's bytes");
  o.decode = bpe->add_subcommand("decode", "write the bytes of token ids");
  o.decode->add_option("--tokenizer", o.tokenizer, source_help)->required();
  o.decode->add_option("ids", o.ids, "token ids");
  o.decode->add_option("--file", o.file, "the ids: this file's, separated by white space");
}

std::optional<int> run_bpe_command(const BpeCommand& o, std::ostream& out) {
  if (o.train && *o.train) return run_bpe_train(o.data, o.merges, o.out, o.save_dir, out);
  if (o.tokenize && *o.tokenize) return run_bpe_tokenize(o.tokenizer, o.data, o.out, out);
  if (o.encode && *o.encode) return run_encode(o, out);
  if (o.decode && *o.decode) return run_decode(o, out);
  return std::nullopt;
}

}  // namespace belay
