// Where a BPE tokenizer is found: a directory of Hugging Face files, a tokenizer.json, or a
// safetensors file (a tokens file, a checkpoint) whose metadata holds tokens.bpe.
#pragma once
#include <string>

#include "apps/text/bpe.h"

namespace belay {

inline constexpr const char* kBpeMetadataKey = "tokens.bpe";  // BpeTokenizer::serialized()

// Errors name `source` and say what it lacks (a byte-level tokens file has no tokens.bpe).
BpeTokenizer load_bpe_tokenizer(const std::string& source);

}  // namespace belay
