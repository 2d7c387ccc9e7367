// `belay bpe train | tokenize | encode | decode`: GPT-2's byte-level BPE (apps/text/bpe.h) from the CLI.
// add_bpe_commands registers the group; after parsing, run_bpe_command runs the one given.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace belay {

// The options of the four subcommands, bound by add_bpe_commands (the caller keeps it alive
// while the CLI::App parses and runs).
struct BpeCommand {
  CLI::App *train = nullptr, *tokenize = nullptr, *encode = nullptr, *decode = nullptr;
  std::string data, out, save_dir, tokenizer, text, file;
  int64_t merges = 0;
  std::vector<std::string> ids;
};

void add_bpe_commands(CLI::App& app, BpeCommand& o);
// The exit status of the `belay bpe ...` command that was parsed, or nothing when it was
// another command. Errors are thrown (UsageError for bad input), as every command's are.
std::optional<int> run_bpe_command(const BpeCommand& o, std::ostream& out);

// `belay bpe train`: trains `merges` merges on the byte-level tokens file `data`'s train split,
// writes both splits' ids to `out` (a tokens file with I64 ids and tokens.bpe), and the Hugging
// Face files into `save_dir` when it is not empty. Checks everything before writing anything.
int run_bpe_train(const std::string& data, int64_t merges, const std::string& out, const std::string& save_dir,
                  std::ostream& log);
// `belay bpe tokenize`: the same file written with the ids of a tokenizer loaded from `tokenizer`
// (apps/text/bpe_source.h: Hugging Face files, or a file that carries one) instead of a new one.
int run_bpe_tokenize(const std::string& tokenizer, const std::string& data, const std::string& out, std::ostream& log);

}  // namespace belay
