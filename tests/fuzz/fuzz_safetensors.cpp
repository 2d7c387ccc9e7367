// libFuzzer target for the safetensors reader. Any input must either parse or throw
// belay::Error: another exception, a sanitizer report or a trap is a finding. What parses
// must load, serialize again and parse back to the same tensors and metadata.
#include <cstdint>
#include <cstring>
#include <optional>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace {

void round_trip(const belay::SafetensorsFile& file) {
  belay::NamedTensors tensors;
  belay::NamedInt64s int64s;
  for (const auto& e : file.entries()) {
    if (e.name.empty()) continue;  // the reader accepts an empty name (the format does); the writer refuses it
    if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") tensors.emplace_back(e.name, file.tensor(e.name));
    else if (e.dtype == "I64") int64s.emplace_back(e.name, file.int64s(e.name));
  }
  auto metadata = file.metadata();
  metadata.erase(belay::kChecksumKey);
  metadata.erase(belay::kHeaderChecksumKey);
  const auto bytes = belay::serialize_safetensors(tensors, metadata, int64s);
  const auto again = belay::parse_safetensors(bytes.data(), bytes.size(), "fuzz-round-trip");
  if (again.metadata().size() != metadata.size() + 2) __builtin_trap();
  for (const auto& [name, t] : tensors) {
    const belay::Tensor u = again.tensor(name);
    if (u.dtype() != t.dtype() || u.shape() != t.shape() || std::memcmp(u.data(), t.data(), t.nbytes()) != 0)
      __builtin_trap();
  }
  for (const auto& [name, v] : int64s)
    if (again.int64s(name) != v) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<belay::SafetensorsFile> file;
  try {
    file = belay::parse_safetensors(data, size, "fuzz-input");
  } catch (const belay::Error&) {
    return 0;  // a clear error is the expected outcome for almost every input
  }
  try {
    round_trip(*file);
  } catch (const belay::Error&) {
    __builtin_trap();  // what the reader accepted, the writer must write and the reader read back
  }
  return 0;
}
