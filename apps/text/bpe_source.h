// Where a BPE tokenizer is found: a directory of Hugging Face files, a tokenizer.json, or a
// safetensors file whose metadata holds it: a tokens file (tokens.bpe), a checkpoint or a model
// file (attach.tokens.bpe, what a checkpoint carries for readers other than the resume).
#pragma once
#include <map>
#include <memory>
#include <string>

#include "apps/text/bpe.h"

namespace belay {

inline constexpr const char* kBpeMetadataKey = "tokens.bpe";  // BpeTokenizer::serialized()
inline constexpr const char* kAttachedBpeMetadataKey = "attach.tokens.bpe";

// The tokenizer a file's metadata records under either key, or nullptr. UsageError naming
// `source` when the record is not a valid tokenizer.
std::shared_ptr<const BpeTokenizer> recorded_bpe_tokenizer(const std::map<std::string, std::string>& metadata,
                                                           const std::string& source);

// Errors name `source` and say what it lacks (a byte-level tokens file has no tokens.bpe).
BpeTokenizer load_bpe_tokenizer(const std::string& source);

}  // namespace belay
