// The token dataset (apps/run/token_dataset.h) against its definition, written here as plain
// code: training window n starts at floor(u * (N - T) / 2^64), u the first word of
// Rng(mix64(stream_seed(seed, "town") + n * golden)); x = ids [s, s + T), y = ids [s + 1,
// s + T]; held-out window w is ids [w T, w T + T]. Files are made here in memory (U8 as
// make_text_corpus.py lays them out, I64 through belay's writer); the script's own file is
// read by the hidden case at the end, which tests/apps/data/make_text_corpus_test.sh runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/run/token_dataset.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"
#include "tests/files.h"
#include "tests/tolerance.h"

using namespace belay;

namespace {

// Ids 0..n-1 mod `vocab` scrambled by a fixed rule: every window differs from its neighbours.
std::vector<int32_t> ids_of(int64_t n, int64_t vocab, uint64_t salt = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(mix64(static_cast<uint64_t>(i) + salt) % vocab);
  return v;
}

int64_t definition_start(uint64_t seed, int64_t n, int64_t train, int64_t context) {
  Rng rng(mix64(stream_seed(seed, 0x6e776f74) + static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ull));
  const unsigned __int128 u = rng.next_u64();
  return static_cast<int64_t>((u * static_cast<uint64_t>(train - context)) >> 64);
}

std::vector<float> as_floats(const std::vector<int32_t>& ids, int64_t begin, int64_t count) {
  return std::vector<float>(ids.begin() + begin, ids.begin() + begin + count);
}

// A safetensors file of 1-D U8 tensors and string metadata, laid out as make_text_corpus.py
// writes it (without belay's checksums, which are optional to its reader).
std::string u8_file(const std::vector<std::pair<std::string, std::string>>& tensors,
                    const std::map<std::string, std::string>& meta) {
  std::ostringstream h;
  h << "{\"__metadata__\":{";
  for (auto it = meta.begin(); it != meta.end(); ++it)
    h << (it == meta.begin() ? "" : ",") << "\"" << it->first << "\":\"" << it->second << "\"";
  h << "}";
  size_t at = 0;
  std::string data;
  for (const auto& [name, bytes] : tensors) {
    h << ",\"" << name << "\":{\"dtype\":\"U8\",\"shape\":[" << bytes.size() << "],\"data_offsets\":[" << at << ","
      << at + bytes.size() << "]}";
    at += bytes.size();
    data += bytes;
  }
  h << "}";
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

const std::map<std::string, std::string> kByteMeta{{"tokens.format", kTokensFormat}, {"tokens.vocab", "256"}};

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = test::temp_path("tokens", name);
  test::spit(path, bytes);
  return path;
}

}  // namespace

TEST_CASE("tokens: training windows are the definition's, x the ids and y the next ids", "[apps][data][tokens]") {
  const int64_t n = 1000, t = 7;
  const std::vector<int32_t> train = ids_of(n, 256);
  TokenDataset d(train, ids_of(50, 256, 9), 256, t, 5, "mem");
  for (int batch = 0; batch < 3; ++batch) {
    const Batch b = d.next(4, Device::cpu());
    REQUIRE(b.x.shape() == Shape{4, t});
    REQUIRE(b.y.shape() == Shape{4, t});
    const std::vector<float> x = b.x.to_vector(), y = b.y.to_vector();
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t s = definition_start(5, batch * 4 + r, n, t);
      CHECK(d.window_start(batch * 4 + r) == s);
      CHECK(test::bits_of(std::vector<float>(x.begin() + r * t, x.begin() + (r + 1) * t)) ==
            test::bits_of(as_floats(train, s, t)));
      CHECK(test::bits_of(std::vector<float>(y.begin() + r * t, y.begin() + (r + 1) * t)) ==
            test::bits_of(as_floats(train, s + 1, t)));
    }
  }
}

TEST_CASE("tokens: starts cover every window that fits, evenly, and the seed changes them", "[apps][data][tokens]") {
  // 12 ids, context 4: starts 0..7 (start 7 ends on the last id). 16000 draws: 2000 each,
  // standard deviation about 42; 6 of them (250) is a bound a correct sampler never meets.
  TokenDataset d(ids_of(12, 256), ids_of(5, 256), 256, 4, 1, "mem");
  std::vector<int64_t> counts(8, 0);
  for (int64_t n = 0; n < 16000; ++n) {
    const int64_t s = d.window_start(n);
    REQUIRE(s >= 0);
    REQUIRE(s < 8);
    ++counts[s];
  }
  for (int64_t c : counts) CHECK(std::abs(c - 2000) < 250);
  TokenDataset e(ids_of(12, 256), ids_of(5, 256), 256, 4, 2, "mem");
  int same = 0;
  for (int64_t n = 0; n < 64; ++n) same += d.window_start(n) == e.window_start(n);
  CHECK(same < 24);  // unrelated streams agree 1 time in 8: 8 expected
}

TEST_CASE("tokens: N batches, the position saved, a fresh dataset there gives the same batches bit for bit",
          "[apps][data][tokens]") {
  const std::vector<int32_t> ids = ids_of(3000, 256);
  const std::string path = write_temp("resume.safetensors", u8_file({{"train", std::string(ids.begin(), ids.end())},
                                                                       {"heldout", "the held-out text"}},
                                                                      kByteMeta));
  const std::unique_ptr<TokenDataset> a = load_token_dataset(path, 16, 42);
  for (int i = 0; i < 5; ++i) a->next(3, Device::cpu());
  const std::string position = a->position();
  CHECK(position == "tokens.v1 seed 42 windows 15");
  const std::unique_ptr<TokenDataset> b = load_token_dataset(path, 16, 42);
  b->set_position(position);
  for (int i = 0; i < 4; ++i) {
    const Batch ba = a->next(3, Device::cpu()), bb = b->next(3, Device::cpu());
    CHECK(test::bits_of(ba.x) == test::bits_of(bb.x));
    CHECK(test::bits_of(ba.y) == test::bits_of(bb.y));
  }
  // Batches of any size draw the same windows: 2 + 3 windows are the 5 of one batch.
  TokenDataset c(ids_of(500, 256), ids_of(40, 256), 256, 8, 3, "mem"), e(ids_of(500, 256), ids_of(40, 256), 256, 8, 3, "mem");
  std::vector<uint32_t> two = test::bits_of(c.next(2, Device::cpu()).y), three = test::bits_of(c.next(3, Device::cpu()).y);
  two.insert(two.end(), three.begin(), three.end());
  CHECK(two == test::bits_of(e.next(5, Device::cpu()).y));
  std::remove(path.c_str());
}

TEST_CASE("tokens: a position that is malformed or of another seed is refused in one line", "[apps][data][tokens]") {
  TokenDataset d(ids_of(100, 256), ids_of(20, 256), 256, 8, 7, "mem");
  CHECK_THROWS_WITH(d.set_position("tokens.v1 seed 8 windows 3"), Catch::Contains("seed 8") && Catch::Contains("seed 7"));
  for (const char* bad : {"", "12", "tokens.v1 seed 7 windows ", "tokens.v1 seed 7 windows x", "tokens.v1 seed  windows 3",
                          "synthetic.v2 rows 6", "tokens.v1 seed 7 windows -1"})
    CHECK_THROWS_AS(d.set_position(bad), UsageError);
  d.set_position("tokens.v1 seed 7 windows 9");
  CHECK(d.position() == "tokens.v1 seed 7 windows 9");
}

TEST_CASE("tokens: held-out windows in order, each id predicted once, the same at every pass", "[apps][data][tokens]") {
  const std::vector<int32_t> held = ids_of(23, 256, 4);  // context 5: windows at 0, 5, 10, 15 (id 21 the last target)
  TokenDataset d(ids_of(100, 256), held, 256, 5, 1, "mem");
  REQUIRE(d.heldout_windows() == 4);
  HeldOutBatches it(d, 3);
  CHECK(it.windows() == 4);
  std::vector<float> xs, ys;
  std::vector<int64_t> sizes;
  while (std::optional<Batch> b = it.next(Device::cpu())) {
    sizes.push_back(b->x.dim(0));
    const std::vector<float> x = b->x.to_vector(), y = b->y.to_vector();
    xs.insert(xs.end(), x.begin(), x.end());
    ys.insert(ys.end(), y.begin(), y.end());
  }
  CHECK(sizes == std::vector<int64_t>{3, 1});
  CHECK(test::bits_of(xs) == test::bits_of(as_floats(held, 0, 20)));
  CHECK(test::bits_of(ys) == test::bits_of(as_floats(held, 1, 20)));
  it.reset();
  CHECK(test::bits_of(it.next(Device::cpu())->y) == test::bits_of(as_floats(held, 1, 15)));
  HeldOutBatches two(d, 8, 2);  // at most 2 windows: the first two
  CHECK(two.windows() == 2);
  CHECK(test::bits_of(two.next(Device::cpu())->x) == test::bits_of(as_floats(held, 0, 10)));
  CHECK_FALSE(two.next(Device::cpu()).has_value());
  CHECK_THROWS_AS(d.heldout_batch(3, 2, Device::cpu()), UsageError);
}

TEST_CASE("tokens: a bad file or split is refused with one line that says what to do", "[apps][data][tokens]") {
  const auto refused = [](const std::string& name, const std::string& bytes, int64_t context, const std::string& what) {
    const std::string path = write_temp(name, bytes);
    INFO(name);
    try {
      load_token_dataset(path, context, 1);
      FAIL("loaded");
    } catch (const UsageError& e) {
      const std::string m = e.what();
      CHECK(m.find(what) != std::string::npos);
      CHECK(m.find(path) != std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
    std::remove(path.c_str());
  };
  const std::string ok(64, 'x');
  refused("short", u8_file({{"train", ok}, {"heldout", "abc"}}, kByteMeta), 8, "fewer than a window of context + 1 = 9");
  refused("vocab", u8_file({{"train", ok + "\xc8"}, {"heldout", ok}}, {{"tokens.vocab", "128"}}), 8,
          "id 200 at 64 of the train split is not in [0, 128)");
  refused("novocab", u8_file({{"train", ok}, {"heldout", ok}}, {}), 8, "tokens.vocab");
  refused("format", u8_file({{"train", ok}, {"heldout", ok}}, {{"tokens.format", "belay.tokens.v9"}, {"tokens.vocab", "256"}}),
          8, "belay.tokens.v1");
  refused("missing", u8_file({{"train", ok}}, kByteMeta), 8, "no tensor 'heldout'");
  const std::vector<uint8_t> f32 = serialize_safetensors({{"train", Tensor::from_vector({1, 2, 3}, Shape{3})}},
                                                         {{"tokens.vocab", "256"}}, {{"heldout", {1, 2, 3}}});
  refused("dtype", std::string(f32.begin(), f32.end()), 1, "dtype F32; token ids must be U8 (byte tokens) or I64");
  const std::vector<uint8_t> i64 = serialize_safetensors({}, {{"tokens.vocab", "1000"}},
                                                         {{"train", {1, 999, 4, 5}}, {"heldout", {3, -2, 7}}});
  refused("negative", std::string(i64.begin(), i64.end()), 1, "id -2 at 1 of the heldout split is not in [0, 1000)");
  const std::vector<uint8_t> wide = serialize_safetensors({}, {{"tokens.vocab", "1000"}},
                                                          {{"train", {1, 999, 4, 5}}, {"heldout", {3, 1000}}});
  refused("wide", std::string(wide.begin(), wide.end()), 1, "id 1000 at 1 of the heldout split");
  // I64 ids below the vocabulary load (a vocabulary wider than bytes).
  const std::vector<uint8_t> good = serialize_safetensors({}, {{"tokens.vocab", "1000"}},
                                                          {{"train", {1, 999, 4, 5}}, {"heldout", {3, 998}}});
  const std::string path = write_temp("i64.safetensors", std::string(good.begin(), good.end()));
  const std::unique_ptr<TokenDataset> d = load_token_dataset(path, 1, 1);
  CHECK(d->vocab() == 1000);
  CHECK(d->train_ids() == std::vector<int32_t>{1, 999, 4, 5});
  CHECK(d->out_features() == 1000);
  CHECK(d->in_features() == 1);
  CHECK(d->classification());
  std::remove(path.c_str());
  CHECK_THROWS_AS(TokenDataset(ids_of(10, 4), ids_of(10, 4), int64_t{1} << 25, 2, 1, "mem"), UsageError);
  CHECK_THROWS_AS(TokenDataset(ids_of(10, 4), ids_of(10, 4), 4, 0, 1, "mem"), UsageError);
}

TEST_CASE("tokens: describe() names the data by its contents, so a resume on other tokens is refused",
          "[apps][data][tokens]") {
  TokenDataset a(ids_of(100, 256), ids_of(20, 256), 256, 8, 1, "f"), b(ids_of(100, 256, 1), ids_of(20, 256), 256, 8, 1, "f");
  CHECK(a.describe() != b.describe());
  CHECK(a.describe().find("train 100, held-out 20") != std::string::npos);
}

TEST_CASE("tokens: the unigram entropy against its closed form, and bytes to tokens and back", "[apps][data][tokens]") {
  // 4 ids equally often: ln 4; ids 0 x3 and 1 x1: -(3/4 ln 3/4 + 1/4 ln 1/4).
  TokenDataset u({0, 1, 2, 3, 3, 2, 1, 0}, {0, 1}, 8, 1, 1, "mem"), s({0, 0, 1, 0}, {0, 1}, 2, 1, 1, "mem");
  const double skew = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25));
  test::check_close({static_cast<float>(u.unigram_entropy_nats()), static_cast<float>(s.unigram_entropy_nats())},
                    {std::log(4.0), skew}, test::tolerance_for(DType::F32, DType::F32, 8));
  const std::string text = "def f():\n\treturn \xc3\xa9";
  const std::vector<int32_t> ids = bytes_to_tokens(text);
  CHECK(ids.back() == 0xa9);
  CHECK(tokens_to_bytes(ids) == text);
  CHECK_THROWS_AS(tokens_to_bytes({65, 256}), Error);
}

// The file that apps/data/make_text_corpus.py wrote (BELAY_TOKENS_FILE): belay's reader
// accepts it (layout and CRC-32C checksums), the splits match the metadata, no file is in
// both, and the entropy the script printed is the one computed here. Hidden: run by
// tests/apps/data/make_text_corpus_test.sh after it runs the script.
TEST_CASE("tokens: the script's file loads and agrees with its metadata", "[.tokens_script]") {
  const char* path = std::getenv("BELAY_TOKENS_FILE");
  REQUIRE(path != nullptr);
  const SafetensorsFile f = read_safetensors(path);
  const std::unique_ptr<TokenDataset> d = load_token_dataset(path, 64, 1);
  CHECK(d->vocab() == 256);
  CHECK(f.meta("tokens.format") == kTokensFormat);
  CHECK(std::to_string(d->train_ids().size()) == f.meta("train.tokens"));
  CHECK(std::to_string(d->heldout_ids().size()) == f.meta("heldout.tokens"));
  std::set<std::string> train_files;
  std::istringstream tf(f.meta("train.files")), hf(f.meta("heldout.files"));
  for (std::string line; std::getline(tf, line);) train_files.insert(line);
  int held = 0;
  for (std::string line; std::getline(hf, line); ++held) CHECK(train_files.count(line) == 0);
  CHECK(held >= 1);
  CHECK(train_files.size() >= 1);
  // Python summed in another order: a sum of 256 terms, compared through the one helper.
  test::check_close({static_cast<float>(d->unigram_entropy_nats() / std::log(2.0))},
                    {std::stod(f.meta("train.unigram_entropy_bits_per_byte"))},
                    test::tolerance_for(DType::F32, DType::F32, 256));
  CHECK(d->next(4, Device::cpu()).x.shape() == Shape{4, 64});
}
