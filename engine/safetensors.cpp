#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/atomic_file.h"
#include "engine/error.h"

namespace belay {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; belay writes host memory as is");

using nlohmann::json;

namespace {

// ---------------------------------------------------------------- CRC-32C (slicing by 8)

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, reflected

struct Crc32cTables {
  uint32_t t[8][256];
};

constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kCrc32cPoly & (0u - (c & 1u)));
    tables.t[0][i] = c;
  }
  // t[s][i]: the CRC of byte i followed by s zero bytes, so eight bytes fold in one step.
  for (int s = 1; s < 8; ++s)
    for (int i = 0; i < 256; ++i) tables.t[s][i] = (tables.t[s - 1][i] >> 8) ^ tables.t[0][tables.t[s - 1][i] & 0xFFu];
  return tables;
}

constexpr Crc32cTables kCrc = make_crc32c_tables();

// ---------------------------------------------------------------- dtypes

struct DTypeInfo {
  const char* name;
  size_t size;
};

// The standard safetensors element types. belay loads F32/F16/BF16, I64 and U8; the others are
// laid out and validated, so a data file that carries an extra tensor still opens.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};

const DTypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

size_t stored_dtype_size(const std::string& name) {
  const DTypeInfo* d = find_dtype(name);
  return d ? d->size : 0;
}

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return "F32";
  }
}

bool belay_dtype(const std::string& name, DType* out) {
  if (name == "F32") *out = DType::F32;
  else if (name == "F16") *out = DType::F16;
  else if (name == "BF16") *out = DType::BF16;
  else return false;
  return true;
}

std::string shape_str(const std::vector<int64_t>& dims) { return Shape(dims).str(); }

std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 0xFu];
  return s;
}

// "crc32c:<8 lowercase hex digits>" -> value; false if it is not that.
bool parse_checksum(const std::string& text, uint32_t* out) {
  const std::string prefix = "crc32c:";
  if (text.size() != prefix.size() + 8 || text.compare(0, prefix.size(), prefix) != 0) return false;
  uint32_t v = 0;
  for (size_t i = prefix.size(); i < text.size(); ++i) {
    const char c = text[i];
    uint32_t d;
    if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
    else return false;
    v = (v << 4) | d;
  }
  *out = v;
  return true;
}

// The header checksum covers the header as nlohmann::json dumps it (keys sorted, no
// whitespace) with belay's two checksum keys taken out of __metadata__, so a flipped byte
// anywhere in the header (a tensor name, a metadata value) is caught, not only in the data.
uint32_t header_checksum(json header) {
  auto it = header.find("__metadata__");
  if (it != header.end() && it->is_object()) {
    it->erase(kChecksumKey);
    it->erase(kHeaderChecksumKey);
  }
  const std::string canonical = header.dump();
  return crc32c(canonical.data(), canonical.size());
}

// Deepest nesting of [ and { outside strings; a legitimate header nests 3 deep. Checked
// before parsing so that a hostile header cannot make a deep tree.
size_t json_nesting_depth(const char* p, size_t n) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

[[noreturn]] void bad_file(const std::string& source, const std::string& problem) {
  throw UsageError(source + ": " + problem);
}

// A non-negative JSON integer that fits in int64, or throws naming what it is.
int64_t json_size(const json& v, const std::string& source, const std::string& what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_file(source, what + " " + std::to_string(u) + " is too large");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) bad_file(source, what + " " + std::to_string(v.get<int64_t>()) + " is negative");
  bad_file(source, what + " is " + v.dump().substr(0, 40) + ", not a non-negative integer");
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = kCrc.t[7][w & 0xFFu] ^ kCrc.t[6][(w >> 8) & 0xFFu] ^ kCrc.t[5][(w >> 16) & 0xFFu] ^
          kCrc.t[4][(w >> 24) & 0xFFu] ^ kCrc.t[3][(w >> 32) & 0xFFu] ^ kCrc.t[2][(w >> 40) & 0xFFu] ^
          kCrc.t[1][(w >> 48) & 0xFFu] ^ kCrc.t[0][w >> 56];
  }
  for (; size > 0; ++p, --size) crc = kCrc.t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

int64_t SafetensorsEntry::numel() const { return Shape(shape).numel(); }

// ---------------------------------------------------------------- reading

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& name_for_errors) {
  return parse_safetensors_buffer(std::vector<uint8_t>(data, data + size), name_for_errors);
}

namespace {

// The header's length n (the first 8 bytes), checked against the file, and its text's
// first checks: starts with '{', no NUL, not nested deeper than a header is.
uint64_t checked_header_length(const std::vector<uint8_t>& bytes, const std::string& source) {
  const size_t size = bytes.size();
  if (size < 8)
    bad_file(source, "file is " + std::to_string(size) +
                         " bytes, shorter than the 8-byte header length: truncated or not a safetensors file");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxSafetensorsHeaderBytes)
    bad_file(source, "header length " + std::to_string(n) + " is absurd (more than " +
                         std::to_string(kMaxSafetensorsHeaderBytes) + " bytes): not a safetensors file or corrupt");
  if (n > size - 8)
    bad_file(source, "header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(size) + " bytes): truncated or corrupt");
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (n == 0 || text[0] != '{') bad_file(source, "header does not start with '{': not a safetensors file or corrupt");
  // nlohmann::json stops at a NUL as at the end of input, which would hide what follows.
  if (std::memchr(text, 0, n) != nullptr) bad_file(source, "header contains a NUL byte: corrupt");
  if (json_nesting_depth(text, n) > 8) bad_file(source, "header nests too deeply to be a safetensors header");
  return n;
}

// The header as a JSON object; a key named twice is an error.
json parse_header(const char* text, uint64_t n, const std::string& source) {
  // nlohmann::json keeps the last of duplicate keys silently; the callback notices them.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get_ref<const std::string&>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    bad_file(source, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!duplicate.empty()) bad_file(source, "header names '" + duplicate + "' twice");
  if (!header.is_object()) bad_file(source, "header is not a JSON object");
  return header;
}

void read_metadata(const json& value, const std::string& source, std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) bad_file(source, "__metadata__ is not an object of strings");
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) bad_file(source, "metadata '" + key + "' is not a string");
    metadata[key] = v.get<std::string>();
  }
}

// A shape's dimensions, and its byte size with `elem`-byte elements; neither may overflow.
uint64_t read_shape(const json& shape, size_t elem, const std::string& source, const std::string& what,
                    std::vector<int64_t>& dims) {
  if (!shape.is_array()) bad_file(source, what + " has a shape that is not an array");
  // The element count may not overflow at any prefix (Shape::numel multiplies in order).
  uint64_t count = 1;
  for (const json& d : shape) {
    const int64_t dim = json_size(d, source, what + " dimension");
    uint64_t next;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &next) ||
        next > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_file(source, what + " has a shape whose element count overflows");
    count = next;
    dims.push_back(dim);
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(elem), &nbytes))
    bad_file(source, what + " has a shape whose byte size overflows");
  return nbytes;
}

// One tensor's description: dtype, shape and data_offsets, which must hold exactly its bytes
// within the data section.
SafetensorsEntry read_entry(const std::string& name, const json& value, uint64_t data_size, const std::string& source) {
  const std::string what = "tensor '" + name + "'";
  if (!value.is_object()) bad_file(source, what + " is not described by an object");
  const auto dtype_it = value.find("dtype");
  const auto shape_it = value.find("shape");
  const auto offsets_it = value.find("data_offsets");
  if (dtype_it == value.end()) bad_file(source, what + " has no dtype");
  if (shape_it == value.end()) bad_file(source, what + " has no shape");
  if (offsets_it == value.end()) bad_file(source, what + " has no data_offsets");
  if (!dtype_it->is_string()) bad_file(source, what + " has a dtype that is not a string");

  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype_it->get<std::string>();
  const size_t elem = stored_dtype_size(e.dtype);
  if (elem == 0) bad_file(source, what + " has unknown dtype '" + e.dtype.substr(0, 40) + "'");
  const uint64_t nbytes = read_shape(*shape_it, elem, source, what, e.shape);

  if (!offsets_it->is_array() || offsets_it->size() != 2)
    bad_file(source, what + " has data_offsets that are not [begin, end]");
  e.begin = static_cast<uint64_t>(json_size((*offsets_it)[0], source, what + " data offset"));
  e.end = static_cast<uint64_t>(json_size((*offsets_it)[1], source, what + " data offset"));
  const std::string offsets = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) bad_file(source, what + " has data_offsets " + offsets + " that run backwards");
  if (e.end > data_size)
    bad_file(source, what + " has data_offsets " + offsets + " past the end of the data (" +
                         std::to_string(data_size) + " bytes): truncated or corrupt");
  if (e.end - e.begin != nbytes)
    bad_file(source, what + " has data_offsets " + offsets + " (" + std::to_string(e.end - e.begin) +
                         " bytes) but shape " + shape_str(e.shape) + " of " + e.dtype + " needs " +
                         std::to_string(nbytes) + " bytes");
  return e;
}

// The tensors must tile the data section exactly: no overlap, no gap, nothing after.
void check_tiling(std::vector<SafetensorsEntry>& entries, uint64_t data_size, const std::string& source) {
  std::stable_sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const auto& e : entries) {
    if (e.begin < at) bad_file(source, "tensor '" + e.name + "' overlaps the tensor before it in the data");
    if (e.begin > at)
      bad_file(source, "tensor '" + e.name + "' leaves a gap of " + std::to_string(e.begin - at) +
                           " bytes before it in the data");
    at = e.end;
  }
  if (at != data_size)
    bad_file(source, "the data section is " + std::to_string(data_size) + " bytes but the tensors cover " +
                         std::to_string(at) + ": trailing bytes or a corrupt header");
}

// The header's and the data's CRC32C, when the metadata records them (both or neither).
void check_checksums(const std::map<std::string, std::string>& metadata, const json& header, const uint8_t* data,
                     uint64_t data_size, const std::string& source) {
  const auto data_sum = metadata.find(kChecksumKey);
  const auto header_sum = metadata.find(kHeaderChecksumKey);
  if ((data_sum == metadata.end()) != (header_sum == metadata.end()))
    bad_file(source, std::string("metadata has one of ") + kChecksumKey + " and " + kHeaderChecksumKey +
                         " but not the other: the header is corrupt");
  if (data_sum == metadata.end()) return;
  uint32_t expected_data = 0, expected_header = 0;
  if (!parse_checksum(data_sum->second, &expected_data))
    bad_file(source, std::string(kChecksumKey) + " is not 'crc32c:<8 hex digits>'");
  if (!parse_checksum(header_sum->second, &expected_header))
    bad_file(source, std::string(kHeaderChecksumKey) + " is not 'crc32c:<8 hex digits>'");
  const uint32_t header_actual = header_checksum(header);
  if (header_actual != expected_header)
    bad_file(source, "header checksum mismatch (stored " + hex32(expected_header) + ", computed " +
                         hex32(header_actual) + "): the header is corrupt");
  const uint32_t data_actual = crc32c(data, data_size);
  if (data_actual != expected_data)
    bad_file(source, "data checksum mismatch (stored " + hex32(expected_data) + ", computed " + hex32(data_actual) +
                         "): the tensor bytes are corrupt");
}

}  // namespace

SafetensorsFile parse_safetensors_buffer(std::vector<uint8_t> bytes, const std::string& source) {
  const uint64_t n = checked_header_length(bytes, source);
  const json header = parse_header(reinterpret_cast<const char*>(bytes.data() + 8), n, source);
  SafetensorsFile file;
  file.source_ = source;
  const uint64_t data_size = bytes.size() - 8 - n;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__")
      read_metadata(value, source, file.metadata_);
    else
      file.entries_.push_back(read_entry(name, value, data_size, source));
  }
  check_tiling(file.entries_, data_size, source);
  check_checksums(file.metadata_, header, bytes.data() + 8 + n, data_size, source);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;
  file.bytes_ = std::move(bytes);
  file.data_start_ = 8 + n;
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot open '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UsageError("cannot stat '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw UsageError("'" + path + "' is not a regular file");
  // The file's own size is the one number here that is not from the file's contents.
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    throw UsageError("'" + path + "' (" + std::to_string(st.st_size) + " bytes) does not fit in memory");
  }
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw UsageError("cannot read '" + path + "': " + std::strerror(errno));
    if (r == 0) throw UsageError("'" + path + "' shrank while it was read");
    got += static_cast<size_t>(r);
  }
  return parse_safetensors_buffer(std::move(bytes), path);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : index_) out.push_back(name);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    std::string have;
    size_t shown = 0;
    for (const auto& [n, i] : index_) {
      if (shown++ == 8) {
        have += ", ...";
        break;
      }
      have += (have.empty() ? "" : ", ") + n;
    }
    throw UsageError(source_ + ": no tensor '" + name + "' (it has: " + (have.empty() ? "none" : have) + ")");
  }
  return entries_[it->second];
}

const std::string& SafetensorsFile::meta(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) throw UsageError(source_ + ": metadata has no '" + key + "'");
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  DType dtype;
  if (!belay_dtype(e.dtype, &dtype))
    throw UsageError(source_ + ": tensor '" + name + "' is " + e.dtype +
                     "; belay loads F32, F16 or BF16 tensors" + (e.dtype == "I64" ? " (use int64s for I64)" : ""));
  Tensor t = Tensor::empty(Shape(e.shape), dtype, Device::cpu());
  if (e.end > e.begin) std::memcpy(t.data(), bytes_of(e), e.end - e.begin);
  return t;
}

Tensor SafetensorsFile::weight(const std::string& name, const Shape& shape, const std::string& needs) const {
  const std::string file = "'" + source_ + "'";
  if (!contains(name)) throw UsageError(file + " has no tensor '" + name + "'");
  const SafetensorsEntry& e = entry(name);
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    throw UsageError(file + ": tensor '" + name + "' is " + e.dtype + "; belay reads F32, F16 or BF16");
  if (Shape(e.shape) != shape)
    throw UsageError(file + ": tensor '" + name + "' has shape " + Shape(e.shape).str() + ", " + needs + " " +
                     shape.str());
  Tensor t = tensor(name);
  for (float v : t.to_vector())
    if (!std::isfinite(v)) throw UsageError(file + ": tensor '" + name + "' has a non-finite value");
  return t;
}

std::vector<int64_t> SafetensorsFile::int64s(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.dtype != "I64") throw UsageError(source_ + ": tensor '" + name + "' is " + e.dtype + ", expected I64");
  std::vector<int64_t> out(static_cast<size_t>((e.end - e.begin) / 8));
  if (!out.empty()) std::memcpy(out.data(), bytes_of(e), e.end - e.begin);
  return out;
}

std::vector<uint8_t> SafetensorsFile::uint8s(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.dtype != "U8") throw UsageError(source_ + ": tensor '" + name + "' is " + e.dtype + ", expected U8");
  return std::vector<uint8_t>(bytes_of(e), bytes_of(e) + (e.end - e.begin));
}

// ---------------------------------------------------------------- writing

namespace {

// What goes to disk: the length-prefixed header, then the chunks in order. Host copies of
// device tensors are kept alive here until the bytes are written.
struct Prepared {
  std::string head;  // 8-byte length + padded JSON
  struct Chunk {
    const void* ptr;
    size_t size;
  };
  std::vector<Chunk> chunks;
  std::vector<Tensor> host_copies;
};

Prepared prepare(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                 const NamedInt64s& int64s) {
  struct Item {
    std::string name;
    const char* dtype;
    std::vector<int64_t> shape;
    const void* ptr;
    size_t size;
    size_t elem;
  };
  Prepared p;
  std::vector<Item> items;
  std::set<std::string> seen;
  const auto check_name = [&](const std::string& name) {
    if (name.empty()) throw Error("write_safetensors: a tensor has an empty name");
    if (name == "__metadata__") throw Error("write_safetensors: '__metadata__' cannot name a tensor");
    if (!seen.insert(name).second) throw Error("write_safetensors: tensor '" + name + "' is given twice");
  };
  p.host_copies.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    check_name(name);
    if (!t.defined()) throw Error("write_safetensors: tensor '" + name + "' is undefined");
    const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    p.host_copies.push_back(host);
    items.push_back({name, safetensors_dtype(t.dtype()), t.shape().dims(), host.data(), host.nbytes(),
                     dtype_size(t.dtype())});
  }
  for (const auto& [name, values] : int64s) {
    check_name(name);
    items.push_back({name, "I64", {static_cast<int64_t>(values.size())}, values.data(), values.size() * 8, 8});
  }
  for (const auto& [key, value] : metadata)
    if (key == kChecksumKey || key == kHeaderChecksumKey)
      throw Error(std::string("write_safetensors: metadata key '") + key + "' is reserved for belay's checksum");

  // Wider elements first: with the data section starting 8-aligned, every tensor is then
  // aligned to its element size, which readers that map the file appreciate.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.elem > b.elem; });

  json header = json::object();
  uint64_t at = 0;
  uint32_t data_crc = 0;
  for (const Item& item : items) {
    header[item.name] = {{"dtype", item.dtype}, {"shape", item.shape}, {"data_offsets", {at, at + item.size}}};
    at += item.size;
    data_crc = crc32c(item.ptr, item.size, data_crc);
    p.chunks.push_back({item.ptr, item.size});
  }
  json meta = json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;
  std::string text;
  try {
    const uint32_t head_crc = header_checksum(header);
    header["__metadata__"][kChecksumKey] = "crc32c:" + hex32(data_crc);
    header["__metadata__"][kHeaderChecksumKey] = "crc32c:" + hex32(head_crc);
    text = header.dump();
  } catch (const json::exception& e) {  // a name or value that is not valid UTF-8
    throw Error(std::string("write_safetensors: a tensor name or metadata string is not valid UTF-8 (") + e.what() +
                ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes)
    throw Error("write_safetensors: the header would be " + std::to_string(text.size()) +
                " bytes, more than readers accept (" + std::to_string(kMaxSafetensorsHeaderBytes) + ")");
  const uint64_t n = text.size();
  p.head.resize(8);
  std::memcpy(p.head.data(), &n, 8);
  p.head += text;
  return p;
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                                           const NamedInt64s& int64s) {
  const Prepared p = prepare(tensors, metadata, int64s);
  std::vector<uint8_t> out(p.head.begin(), p.head.end());
  for (const auto& c : p.chunks) {
    const auto* b = static_cast<const uint8_t*>(c.ptr);
    out.insert(out.end(), b, b + c.size);
  }
  return out;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata, const NamedInt64s& int64s) {
  const Prepared p = prepare(tensors, metadata, int64s);  // bad input throws before any file is touched
  AtomicFile file(path);
  file.write(p.head.data(), p.head.size(), "writing the header");
  for (const auto& c : p.chunks) file.write(c.ptr, c.size, "writing the tensor data");
  file.commit();
}

}  // namespace belay
