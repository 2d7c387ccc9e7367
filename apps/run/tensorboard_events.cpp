#include "apps/run/tensorboard_events.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "engine/error.h"

namespace belay {

namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), a byte at a time from a table.
struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1u ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
  }
};

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

template <class T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts (x86-64, the only ones belay builds for)
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& s) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, s.size());
  out += s;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const Crc32cTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string event_message(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars,
                          const std::string& file_version) {
  std::string e;
  e += static_cast<char>(1 << 3 | 1);  // wall_time: 64-bit
  fixed(e, wall_time);
  e += static_cast<char>(2 << 3 | 0);  // step: varint
  varint(e, static_cast<uint64_t>(step));
  if (!file_version.empty()) {
    bytes_field(e, 3, file_version);
    return e;
  }
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);
    v += static_cast<char>(2 << 3 | 5);  // simple_value: 32-bit
    fixed(v, value);
    bytes_field(summary, 1, v);
  }
  bytes_field(e, 5, summary);
  return e;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  fixed(r, len);
  fixed(r, masked_crc32c(&len, sizeof len));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("cannot create TensorBoard directory '" + dir + "': " + ec.message());
  const double t = now_seconds();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + ".belay")).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw UsageError("cannot write TensorBoard events in '" + dir + "': " + std::strerror(errno));
  const std::string first = tfrecord(event_message(t, 0, {}, "brain.Event:2"));
  if (std::fwrite(first.data(), 1, first.size(), file_) != first.size() || std::fflush(file_) != 0)
    throw UsageError("writing TensorBoard events '" + path_ + "' failed: " + std::strerror(errno));
}

TensorBoardWriter::~TensorBoardWriter() { close(); }

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  if (!file_) throw Error("TensorBoard events '" + path_ + "' are closed");
  const std::string r = tfrecord(event_message(now_seconds(), step, values));
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0)
    throw Error("writing TensorBoard events '" + path_ + "' failed: " + std::strerror(errno));
}

void TensorBoardWriter::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

}  // namespace belay
