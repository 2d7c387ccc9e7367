// The safetensors file format: checkpoints, exported weights and the user's data files.
// Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces
// to a multiple of 8), then the raw little-endian tensor bytes, tightly packed.
// Writes are atomic (temporary file, fsync, rename); reads validate every number in the
// file against the file's size before trusting it, and throw belay::UsageError naming the
// file and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/atomic_file.h"  // remove_stale_temporaries, which the writer calls first
#include "engine/tensor.h"

namespace belay {

// Metadata keys that belay owns: the CRC-32C of the data section and of the header.
// Present together or not at all (files from other tools carry neither).
inline constexpr const char* kChecksumKey = "belay.checksum";
inline constexpr const char* kHeaderChecksumKey = "belay.header_checksum";
// The reference implementation refuses headers above this size; so does belay.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor as the header describes it. `dtype` is the safetensors name ("F32", "F16",
// "BF16", "I64", "U8", and the other standard names, which belay lays out but cannot load).
// `begin`/`end` are byte offsets into the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  const std::string& source() const { return source_; }  // the path (or label) errors name
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data order
  std::vector<std::string> names() const;                                      // sorted
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the missing tensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The metadata value, or throws naming the file and the missing key.
  const std::string& meta(const std::string& key) const;

  // An F32/F16/BF16 tensor as a new CPU tensor of that dtype (the bytes, bit for bit).
  Tensor tensor(const std::string& name) const;
  // A weight: an F32/F16/BF16 tensor of exactly `shape`, every value finite, as tensor() gives
  // it. The one reader of weights checked before use (--init, sample, belay import and export):
  // a UsageError in one line naming the file and the tensor otherwise; `needs` says who wants
  // that shape ("the model needs", "config.json's n_embd need").
  Tensor weight(const std::string& name, const Shape& shape, const std::string& needs) const;
  // An I64 tensor's values, flattened row-major.
  std::vector<int64_t> int64s(const std::string& name) const;
  // A U8 tensor's bytes, flattened row-major (byte-level token files, apps/run/token_dataset.h).
  std::vector<uint8_t> uint8s(const std::string& name) const;

 private:
  friend SafetensorsFile parse_safetensors_buffer(std::vector<uint8_t> bytes, const std::string& source);
  const uint8_t* bytes_of(const SafetensorsEntry& e) const { return bytes_.data() + data_start_ + e.begin; }

  std::string source_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<uint8_t> bytes_;  // the whole file
  size_t data_start_ = 0;
};

// Reads and validates a file. Throws UsageError naming `path` and what is wrong with it.
SafetensorsFile read_safetensors(const std::string& path);
// The same on a buffer (the fuzzer's entry point); `name_for_errors` stands for the path.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& name_for_errors);
// The same, taking ownership of the buffer (no copy).
SafetensorsFile parse_safetensors_buffer(std::vector<uint8_t> bytes, const std::string& source);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using NamedInt64s = std::vector<std::pair<std::string, std::vector<int64_t>>>;  // written as 1-D I64

// Writes `tensors` (F32/F16/BF16, any device: CUDA tensors are copied to the host),
// `int64s` and `metadata` to `path` atomically: a temporary file in the same directory,
// fsync, rename over `path`, fsync of the directory. On any failure the temporary is
// removed, `path` is left as it was, and belay::Error names the path and the cause.
// The data and header checksums are added to the metadata.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {}, const NamedInt64s& int64s = {});
// The bytes write_safetensors would write (tests, fuzz seeds, in-memory round trips).
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata = {},
                                           const NamedInt64s& int64s = {});

// CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use it); `crc` continues a previous call.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace belay
