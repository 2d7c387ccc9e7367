// Finding a BPE tokenizer by what the path is (apps/text/bpe_source.h).
#include "apps/text/bpe_source.h"

#include <filesystem>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace belay {

BpeTokenizer load_bpe_tokenizer(const std::string& source) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(source, ec)) return BpeTokenizer::from_directory(source);
  if (!fs::exists(source, ec)) throw UsageError(source + ": no such file or directory (a tokenizer: a directory of "
                                                "Hugging Face files, a tokenizer.json, or a tokens file or checkpoint with tokens.bpe)");
  if (fs::path(source).extension() == ".json") return BpeTokenizer::from_tokenizer_json(source);
  const SafetensorsFile file = read_safetensors(source);
  const auto it = file.metadata().find(kBpeMetadataKey);
  if (it == file.metadata().end())
    throw UsageError(source + ": its metadata has no " + kBpeMetadataKey +
                     " (no BPE tokenizer: a byte-level tokens file's ids are the bytes themselves)");
  return BpeTokenizer::from_serialized(it->second, source);
}

}  // namespace belay
