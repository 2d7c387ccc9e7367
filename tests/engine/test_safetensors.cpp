// The safetensors layer: bit-exact round trips, every malformed input a clear
// belay::Error (never a crash), and writes that leave the previous file intact on failure.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace fs = std::filesystem;
using belay::DType;
using belay::Shape;
using belay::Tensor;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("belay_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
            std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A tensor holding arbitrary bit patterns (NaN payloads, subnormals, -0 included).
Tensor random_bits(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// A small file with every dtype, an I64 tensor and metadata: what the damage tests break.
std::vector<uint8_t> sample_bytes() {
  return belay::serialize_safetensors(
      {{"w", Tensor::from_vector({1, -2, 3.5f, 0.25f, -0.0f, 7}, Shape{2, 3})},
       {"h", Tensor::from_vector({1, 2, 3, 4}, Shape{4}, DType::F16)},
       {"b", Tensor::from_vector({-1, 0.5f, 3}, Shape{3}, DType::BF16)}},
      {{"step", "12"}, {"scaler.scale", "65536"}}, {{"labels", {0, 2, 1, -5}}});
}

size_t data_start(const std::vector<uint8_t>& file) {
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  return 8 + static_cast<size_t>(n);
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    belay::parse_safetensors(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const belay::Error& e) {
    return e.what();
  }
  return "";
}

// A file from a header given as text (padded like the reference) and raw data bytes.
std::vector<uint8_t> craft(std::string header, const std::vector<uint8_t>& data = {}) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + header.size() + data.size());
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<long>(header.size()));
  return out;
}

// CRC-32C one bit at a time, the definition the fast version must agree with.
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

TEST_CASE("crc32c matches the standard check value and the bitwise definition", "[engine][safetensors]") {
  REQUIRE(belay::crc32c("123456789", 9) == 0xE3069283u);
  REQUIRE(belay::crc32c("", 0) == 0u);
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(300);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; n + off <= buf.size(); n += 13) {
      REQUIRE(belay::crc32c(buf.data() + off, n) == crc32c_bitwise(buf.data() + off, n));
      const size_t half = n / 3;  // continuing a CRC equals one pass over the whole
      REQUIRE(belay::crc32c(buf.data() + off + half, n - half, belay::crc32c(buf.data() + off, half)) ==
              belay::crc32c(buf.data() + off, n));
    }
}

TEST_CASE("safetensors round trip is bit-exact for every dtype and shape", "[engine][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const belay::NamedTensors tensors = {
      {"f32", random_bits(Shape{3, 5}, DType::F32, 1)},
      {"f16", random_bits(Shape{7}, DType::F16, 2)},
      {"bf16", random_bits(Shape{2, 3, 2}, DType::BF16, 3)},
      {"scalar", random_bits(Shape{}, DType::F32, 4)},
      {"empty", Tensor::empty(Shape{0, 4}, DType::F16)},
      {"layer.0/weight", random_bits(Shape{1, 1, 1, 9}, DType::BF16, 5)},
  };
  const std::vector<int64_t> labels = {0, 1, -1, std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max(), int64_t{1} << 40};
  belay::write_safetensors(path, tensors, {}, {{"labels", labels}, {"no_labels", {}}});

  const belay::SafetensorsFile file = belay::read_safetensors(path);
  REQUIRE(file.entries().size() == tensors.size() + 2);
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(file.contains(name));
    REQUIRE(same_bytes(file.tensor(name), t));
  }
  REQUIRE(file.entry("f16").dtype == "F16");
  REQUIRE(file.entry("bf16").dtype == "BF16");
  REQUIRE(file.entry("scalar").shape.empty());
  REQUIRE(file.entry("labels").dtype == "I64");
  REQUIRE(file.entry("labels").shape == std::vector<int64_t>{6});
  REQUIRE(file.int64s("labels") == labels);
  REQUIRE(file.int64s("no_labels").empty());
  REQUIRE(file.names() == std::vector<std::string>{"bf16", "empty", "f16", "f32", "labels", "layer.0/weight",
                                                   "no_labels", "scalar"});
  // The file on disk is exactly what serialize_safetensors makes.
  REQUIRE(slurp(path) == belay::serialize_safetensors(tensors, {}, {{"labels", labels}, {"no_labels", {}}}));
}

TEST_CASE("safetensors metadata round trips, checksums added", "[engine][safetensors]") {
  const std::map<std::string, std::string> meta = {
      {"step", "1200"}, {"empty", ""}, {"quoted \"key\"", "back\\slash\nnewline\ttab"}, {"unicode", "h\xc3\xa9llo"}};
  const auto bytes = belay::serialize_safetensors({{"x", Tensor::full(Shape{2}, 1.0f)}}, meta);
  const auto file = belay::parse_safetensors(bytes.data(), bytes.size(), "mem");
  for (const auto& [k, v] : meta) REQUIRE(file.meta(k) == v);
  REQUIRE(file.metadata().size() == meta.size() + 2);
  REQUIRE(file.meta(belay::kChecksumKey).rfind("crc32c:", 0) == 0);
  REQUIRE(file.meta(belay::kHeaderChecksumKey).rfind("crc32c:", 0) == 0);
  REQUIRE_THROWS_WITH(file.meta("absent"), Catch::Contains("mem") && Catch::Contains("absent"));
}

TEST_CASE("safetensors layout follows the format", "[engine][safetensors]") {
  const auto bytes = sample_bytes();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  REQUIRE(n % 8 == 0);
  REQUIRE(bytes[8] == '{');
  const auto file = belay::parse_safetensors(bytes.data(), bytes.size(), "mem");
  // Tensors tile the data section; wider elements first, so each is aligned to its size.
  uint64_t at = 0;
  for (const auto& e : file.entries()) {
    REQUIRE(e.begin == at);
    const uint64_t elem = e.dtype == "I64" ? 8 : e.dtype == "F32" ? 4 : 2;
    REQUIRE(e.begin % elem == 0);
    at = e.end;
  }
  REQUIRE(8 + n + at == bytes.size());
  // Little-endian bytes of the first F32 element (w[0] = 1.0f).
  const auto& w = file.entry("w");
  const uint8_t one_le[4] = {0x00, 0x00, 0x80, 0x3f};
  REQUIRE(std::memcmp(bytes.data() + 8 + n + w.begin, one_le, 4) == 0);
}

TEST_CASE("safetensors files from other tools (no checksum, other dtypes) open", "[engine][safetensors]") {
  std::vector<uint8_t> data(4 + 8);
  const float x = 2.5f;
  const double d = -1.0;
  std::memcpy(data.data(), &x, 4);
  std::memcpy(data.data() + 4, &d, 8);
  const auto bytes = craft(
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"d":{"dtype":"F64","shape":[],"data_offsets":[4,12]},)"
      R"("__metadata__":{"format":"pt"}})",
      data);
  const auto file = belay::parse_safetensors(bytes.data(), bytes.size(), "torch.safetensors");
  REQUIRE(file.tensor("x").item() == 2.5f);
  REQUIRE(file.meta("format") == "pt");
  REQUIRE_THROWS_WITH(file.tensor("d"), Catch::Contains("torch.safetensors") && Catch::Contains("F64"));
  REQUIRE_THROWS_WITH(file.int64s("x"), Catch::Contains("expected I64"));
  REQUIRE_THROWS_WITH(file.tensor("y"), Catch::Contains("no tensor 'y'") && Catch::Contains("d, x"));
}

TEST_CASE("a truncated safetensors file is an error at every offset, never a crash", "[engine][safetensors]") {
  const auto bytes = sample_bytes();
  const size_t header_end = data_start(bytes);
  std::vector<size_t> cuts;
  for (size_t i = 0; i <= header_end + 8; ++i) cuts.push_back(i);
  for (size_t i = header_end + 8; i < bytes.size(); i += 5) cuts.push_back(i);
  cuts.push_back(bytes.size() - 1);
  for (size_t cut : cuts) {
    INFO("truncated to " << cut << " of " << bytes.size() << " bytes");
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    REQUIRE_THROWS_AS(belay::parse_safetensors(part.data(), part.size(), "cut.safetensors"), belay::Error);
    REQUIRE_THAT(parse_error(part), Catch::Contains("bad.safetensors"));
  }
  // One extra byte at the end is as wrong as one missing.
  auto longer = bytes;
  longer.push_back(0);
  REQUIRE_THAT(parse_error(longer), Catch::Contains("trailing bytes"));

  // The same through the file reader.
  TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, header_end / 2, header_end, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<long>(cut));
    REQUIRE_THROWS_WITH(belay::read_safetensors(path), Catch::Contains(path));
  }
}

TEST_CASE("a flipped byte in the tensor data is a checksum error", "[engine][safetensors]") {
  const auto bytes = sample_bytes();
  for (size_t i = data_start(bytes); i < bytes.size(); ++i)
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      auto bad = bytes;
      bad[i] ^= mask;
      INFO("byte " << i << " ^ " << int(mask));
      REQUIRE_THAT(parse_error(bad), Catch::Contains("data checksum mismatch"));
    }
}

TEST_CASE("a flipped byte anywhere in the header is an error", "[engine][safetensors]") {
  // Whether the damage breaks the JSON, the layout or only a name or metadata value (caught
  // by the header checksum), reading must fail.
  const auto bytes = sample_bytes();
  size_t by_checksum = 0;
  for (size_t i = 0; i < data_start(bytes); ++i)
    for (int bit = 0; bit < 9; ++bit) {
      auto bad = bytes;
      bad[i] ^= bit < 8 ? static_cast<uint8_t>(1u << bit) : uint8_t{0xFF};
      INFO("byte " << i << " ('" << char(bytes[i]) << "') flipped, pattern " << bit);
      const std::string err = parse_error(bad);
      REQUIRE_FALSE(err.empty());
      if (err.find("header checksum mismatch") != std::string::npos) ++by_checksum;
    }
  REQUIRE(by_checksum > 0);  // some flips keep valid JSON and the same layout
}

TEST_CASE("malformed safetensors headers are clear errors", "[engine][safetensors]") {
  const std::vector<uint8_t> four(4, 0);
  const auto entry = [](const std::string& body) { return "{\"t\":{" + body + "}}"; };
  struct Case {
    std::vector<uint8_t> bytes;
    const char* expected;
  };
  std::vector<Case> cases = {
      {{1, 2, 3}, "shorter than the 8-byte header length"},
      {craft("{}", {}), ""},  // valid: no tensors
      {craft("[1,2]"), "does not start with '{'"},
      {craft("{\"t\": 1"), "not valid JSON"},
      {craft("{\"t\": \"x\"}"), "not described by an object"},
      {craft(entry(R"("shape":[1],"data_offsets":[0,4])"), four), "has no dtype"},
      {craft(entry(R"("dtype":"F32","data_offsets":[0,4])"), four), "has no shape"},
      {craft(entry(R"("dtype":"F32","shape":[1])"), four), "has no data_offsets"},
      {craft(entry(R"("dtype":"F31","shape":[1],"data_offsets":[0,4])"), four), "unknown dtype 'F31'"},
      {craft(entry(R"("dtype":7,"shape":[1],"data_offsets":[0,4])"), four), "dtype that is not a string"},
      {craft(entry(R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])"), four), "is negative"},
      {craft(entry(R"("dtype":"F32","shape":[1.5],"data_offsets":[0,4])"), four), "not a non-negative integer"},
      {craft(entry(R"("dtype":"F32","shape":1,"data_offsets":[0,4])"), four), "shape that is not an array"},
      {craft(entry(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4])"), four), "overflows"},
      {craft(entry(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4])"), four), "too large"},
      {craft(entry(R"("dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4])"), four),
       "not a non-negative integer"},
      {craft(entry(R"("dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4])"), four), "overflows"},
      {craft(entry(R"("dtype":"F32","shape":[1],"data_offsets":[0,8])"), four), "past the end of the data"},
      {craft(entry(R"("dtype":"F32","shape":[1],"data_offsets":[4,0])"), four), "run backwards"},
      {craft(entry(R"("dtype":"F32","shape":[1],"data_offsets":[0])"), four), "not [begin, end]"},
      {craft(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,4])"), four), "needs 8 bytes"},
      {craft(entry(R"("dtype":"F32","shape":[1],"data_offsets":[0,4])"), std::vector<uint8_t>(8)), "trailing bytes"},
      {craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}})",
             std::vector<uint8_t>(6)),
       "overlaps"},
      {craft(R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
             R"("b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}})",
             std::vector<uint8_t>(6)),
       "gap of 2 bytes"},
      {craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             std::vector<uint8_t>(8)),
       "names 'a' twice"},
      {craft(R"({"__metadata__":{"k":"1","k":"2"}})"), "names 'k' twice"},
      {craft(R"({"__metadata__":{"k":1}})"), "metadata 'k' is not a string"},
      {craft(R"({"__metadata__":[]})"), "__metadata__ is not an object"},
      {craft(R"({"__metadata__":{"belay.checksum":"crc32c:00000000"}})"), "but not the other"},
      {craft(R"({"__metadata__":{"belay.checksum":"md5:1","belay.header_checksum":"crc32c:00000000"}})"),
       "is not 'crc32c:<8 hex digits>'"},
      {craft(R"({"__metadata__":{"belay.checksum":"crc32c:00000000","belay.header_checksum":"crc32c:00000000"}})"),
       "header checksum mismatch"},
      {craft("{\"a\":" + std::string(40, '[') + std::string(40, ']') + "}"), "nests too deeply"},
      {craft("{\"\xff\":1}"), "not valid JSON"},
      {craft(std::string("{}\0{\"x\":2}", 10)), "NUL byte"},
  };
  // Header lengths that do not fit the file, or are absurd.
  for (uint64_t n : {uint64_t{16}, uint64_t{100'000'001}, ~uint64_t{0}}) {
    std::vector<uint8_t> b(12, ' ');
    std::memcpy(b.data(), &n, 8);
    cases.push_back({b, n == 16 ? "runs past the end of the file" : "is absurd"});
  }
  for (const auto& c : cases) {
    INFO(std::string(c.bytes.begin(), c.bytes.end()));
    const std::string err = parse_error(c.bytes);
    if (std::string(c.expected).empty()) {
      REQUIRE(err.empty());
    } else {
      REQUIRE_THAT(err, Catch::StartsWith("bad.safetensors: ") && Catch::Contains(c.expected));
    }
  }
}

TEST_CASE("write_safetensors refuses bad input before touching the file", "[engine][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  belay::write_safetensors(path, {{"w", Tensor::full(Shape{3}, 2.0f)}}, {{"step", "1"}});
  const auto before = slurp(path);
  const Tensor ok = Tensor::full(Shape{2}, 1.0f);
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"w", Tensor()}}), Catch::Contains("'w' is undefined"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"w", ok}, {"w", ok}}), Catch::Contains("given twice"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"w", ok}}, {}, {{"w", {1}}}), Catch::Contains("given twice"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"__metadata__", ok}}), Catch::Contains("cannot name"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"", ok}}), Catch::Contains("empty name"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"w", ok}}, {{belay::kChecksumKey, "x"}}),
                      Catch::Contains("reserved"));
  REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"w", ok}}, {{"k", "\xff"}}), Catch::Contains("UTF-8"));
  REQUIRE(slurp(path) == before);
  REQUIRE(dir.listing() == std::vector<std::string>{"ckpt.safetensors"});
}

TEST_CASE("a failed write names the path and leaves no temporary behind", "[engine][safetensors]") {
  TempDir dir;
  const Tensor t = Tensor::full(Shape{4}, 3.0f);

  SECTION("the parent is a regular file") {
    std::ofstream(dir.file("plain")) << "not a directory";
    const std::string path = dir.file("plain") + "/ckpt.safetensors";
    REQUIRE_THROWS_WITH(belay::write_safetensors(path, {{"t", t}}), Catch::Contains(path));
    REQUIRE(dir.listing() == std::vector<std::string>{"plain"});
  }
  SECTION("the destination is a directory: the rename fails after the data is written") {
    fs::create_directory(dir.file("ckpt.safetensors"));
    REQUIRE_THROWS_WITH(belay::write_safetensors(dir.file("ckpt.safetensors"), {{"t", t}}),
                        Catch::Contains("ckpt.safetensors") && Catch::Contains("renaming"));
    REQUIRE(fs::is_directory(dir.file("ckpt.safetensors")));
    REQUIRE(dir.listing() == std::vector<std::string>{"ckpt.safetensors"});
  }
  SECTION("the disk fills up mid-write: the previous checkpoint survives") {
    const std::string path = dir.file("ckpt.safetensors");
    belay::write_safetensors(path, {{"t", t}}, {{"step", "1"}});
    const auto before = slurp(path);
    // RLIMIT_FSIZE makes write() fail with EFBIG once the temporary passes 64 KiB.
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_limit;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string message;
    try {
      belay::write_safetensors(path, {{"t", Tensor::full(Shape{1 << 20}, 1.0f)}}, {{"step", "2"}});
    } catch (const belay::Error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::signal(SIGXFSZ, old_handler);
    REQUIRE_THAT(message, Catch::Contains(path) && Catch::Contains("writing the tensor data"));
    REQUIRE(slurp(path) == before);
    REQUIRE(dir.listing() == std::vector<std::string>{"ckpt.safetensors"});
    REQUIRE(belay::read_safetensors(path).meta("step") == "1");
  }
  SECTION("a successful write replaces the file") {
    const std::string path = dir.file("ckpt.safetensors");
    belay::write_safetensors(path, {{"t", t}}, {{"step", "1"}});
    belay::write_safetensors(path, {{"t", Tensor::full(Shape{2}, 5.0f)}}, {{"step", "2"}});
    const auto file = belay::read_safetensors(path);
    REQUIRE(file.meta("step") == "2");
    REQUIRE(file.tensor("t").to_vector() == std::vector<float>{5, 5});
    REQUIRE(dir.listing() == std::vector<std::string>{"ckpt.safetensors"});
  }
}

TEST_CASE("read_safetensors names the path when it cannot read it", "[engine][safetensors]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(belay::read_safetensors(dir.file("missing.safetensors")),
                      Catch::Contains("missing.safetensors") && Catch::Contains("cannot open"));
  REQUIRE_THROWS_WITH(belay::read_safetensors(dir.path.string()), Catch::Contains("not a regular file"));
}

TEST_CASE("a write removes the temporary files a killed writer left, and only those", "[engine][safetensors]") {
  const TempDir dir;
  const std::string target = dir.file("ckpt.safetensors");
  // A process that has exited: its pid is gone (and not reused within this test, in practice).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const std::string dead = target + ".tmp." + std::to_string(child) + ".3";
  const std::string alive = target + ".tmp." + std::to_string(::getpid()) + ".7";  // a write in progress
  const std::string init = target + ".tmp.1.0";            // pid 1 runs: never ours to remove
  const std::string not_ours = target + ".tmp.notes";      // not PID.N
  const std::string other_file = dir.file("other.safetensors") + ".tmp." + std::to_string(child) + ".0";
  for (const std::string& p : {dead, alive, init, not_ours, other_file}) std::ofstream(p) << "partial";
  belay::write_safetensors(target, {{"w", Tensor::from_vector({1.0f}, Shape{1})}});
  CHECK_FALSE(fs::exists(dead));
  for (const std::string& p : {alive, init, not_ours, other_file}) {
    INFO(p);
    CHECK(fs::exists(p));
  }
  CHECK(belay::read_safetensors(target).tensor("w").item() == 1.0f);
  CHECK(belay::remove_stale_temporaries(target) == 0);
}
