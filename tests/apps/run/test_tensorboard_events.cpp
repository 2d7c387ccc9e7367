// The TensorBoard event files: CRC-32C against its published check value, and a file written by
// TensorBoardWriter read back record by record (each length and payload CRC verified) with the
// protobuf fields decoded by a reader of this test's own, so the writer is not its own judge.
// (TensorBoard's reader reads them too: tests/apps/python/test_belay.py, where it is installed.)
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/run/tensorboard_events.h"
#include "tests/files.h"

using namespace belay;

namespace {

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> values;
};

uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

std::string read_bytes(const std::string& s, size_t& i) {
  const uint64_t n = read_varint(s, i);
  std::string out = s.substr(i, n);
  i += n;
  return out;
}

Event parse_event(const std::string& e) {
  Event ev;
  for (size_t i = 0; i < e.size();) {
    const uint64_t key = read_varint(e, i);
    if (key == (1 << 3 | 1)) {
      std::memcpy(&ev.wall_time, e.data() + i, 8);
      i += 8;
    } else if (key == (2 << 3 | 0)) {
      ev.step = static_cast<int64_t>(read_varint(e, i));
    } else if (key == (3 << 3 | 2)) {
      ev.file_version = read_bytes(e, i);
    } else if (key == (5 << 3 | 2)) {
      const std::string summary = read_bytes(e, i);
      for (size_t j = 0; j < summary.size();) {
        REQUIRE(read_varint(summary, j) == (1 << 3 | 2));
        const std::string value = read_bytes(summary, j);
        size_t k = 0;
        REQUIRE(read_varint(value, k) == (1 << 3 | 2));
        const std::string tag = read_bytes(value, k);
        REQUIRE(read_varint(value, k) == (2 << 3 | 5));
        float f;
        std::memcpy(&f, value.data() + k, 4);
        ev.values[tag] = f;
      }
    } else {
      FAIL("unexpected field key " << key);
    }
  }
  return ev;
}

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<Event> out;
  for (size_t i = 0; i < s.size();) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    REQUIRE(i + 12 <= s.size());
    std::memcpy(&len, s.data() + i, 8);
    std::memcpy(&len_crc, s.data() + i + 8, 4);
    CHECK(len_crc == masked_crc32c(s.data() + i, 8));
    const std::string data = s.substr(i + 12, len);
    std::memcpy(&data_crc, s.data() + i + 12 + len, 4);
    CHECK(data_crc == masked_crc32c(data.data(), data.size()));
    out.push_back(parse_event(data));
    i += 12 + len + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C's check value and an event file read back", "[apps][tensorboard]") {
  CHECK(crc32c("123456789", 9) == 0xe3069283u);  // the CRC-32C check value (RFC 3720)
  const std::string dir = test::temp_path("tensorboard", "events");
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.scalars(3, {{"step/loss", 2.5f}, {"census_headroom_bits/wte.weight", 7.25f}});
    w.scalars(300, {{"step/loss", 1.0f}});
  }
  const std::vector<Event> ev = read_events(path);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[1].step == 3);
  CHECK(ev[1].values.at("step/loss") == 2.5f);
  CHECK(ev[1].values.at("census_headroom_bits/wte.weight") == 7.25f);
  CHECK(ev[2].step == 300);
  CHECK(ev[2].wall_time >= ev[1].wall_time);
}
