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
  const std::shared_ptr<const BpeTokenizer> recorded = recorded_bpe_tokenizer(read_safetensors(source).metadata(), source);
  if (!recorded)
    throw UsageError(source + ": its metadata has no " + kBpeMetadataKey +
                     " (no BPE tokenizer: a byte-level tokens file's ids are the bytes themselves)");
  return *recorded;
}

std::shared_ptr<const BpeTokenizer> recorded_bpe_tokenizer(const std::map<std::string, std::string>& metadata,
                                                           const std::string& source) {
  auto it = metadata.find(kBpeMetadataKey);
  if (it == metadata.end()) it = metadata.find(kAttachedBpeMetadataKey);
  if (it == metadata.end()) return nullptr;
  return std::make_shared<const BpeTokenizer>(BpeTokenizer::from_serialized(it->second, source));
}

}  // namespace belay
