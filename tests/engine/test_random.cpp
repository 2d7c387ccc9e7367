// The random generator and its streams: the same bits on every machine and after a
// reseed; rank streams that differ between ranks and steps, repeat exactly, and resume
// from (seed, rank, step) alone (what a checkpoint records).
#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "engine/random.h"

using namespace belay;

namespace {

std::vector<uint64_t> draws(Rng r, int n) {
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(r.next_u64());
  return out;
}

}  // namespace

TEST_CASE("Rng: seeding is splitmix64 as it always was (initial weights and data keep their bits)", "[engine][random]") {
  // The seeding loop written out by hand, as the generator had it before mix64 was factored out.
  uint64_t seed = 42;
  std::array<uint64_t, 4> expected{};
  for (auto& w : expected) {
    seed += 0x9e3779b97f4a7c15ull;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    w = z ^ (z >> 31);
  }
  CHECK(Rng(42).state() == expected);
}

TEST_CASE("Rng: the state as hex round-trips and rejects anything else", "[engine][random]") {
  Rng a(3);
  a.next_u64();
  Rng b(0);
  REQUIRE(b.set_state_hex(a.state_hex()));
  CHECK(draws(a, 8) == draws(b, 8));
  CHECK(a.state_hex().size() == 64);
  const auto kept = b.state();
  for (const std::string& bad : {std::string(), std::string("12"), std::string(64, 'g'), std::string(63, '0'), std::string(64, 'A')}) {
    CHECK_FALSE(b.set_state_hex(bad));
    CHECK(b.state() == kept);
  }
}

TEST_CASE("rank streams differ between ranks and steps, and repeat exactly", "[engine][random]") {
  std::set<std::vector<uint64_t>> seen;
  for (int rank = 0; rank < 4; ++rank)
    for (int64_t step = 0; step < 4; ++step) {
      const std::vector<uint64_t> d = draws(rank_stream(7, rank, step), 4);
      CHECK(d == draws(rank_stream(7, rank, step), 4));  // the same three numbers, the same bits
      CHECK(seen.insert(d).second);                      // no two (rank, step) alike
    }
  // Other seeds give other streams; none is a shared stream of the run (Rng(seed)).
  CHECK(draws(rank_stream(8, 0, 0), 4) != draws(rank_stream(7, 0, 0), 4));
  CHECK(draws(rank_stream(7, 0, 0), 4) != draws(Rng(7), 4));
  // The ids are not interchangeable: (rank 1, step 0) is not (rank 0, step 1).
  CHECK(stream_seed(7, 1, 0) != stream_seed(7, 0, 1));
  CHECK(stream_seed(7, 0, 0, 1) != stream_seed(7, 0, 1, 0));
}

TEST_CASE("a rank stream resumes from the checkpoint's seed and step alone", "[engine][random]") {
  // A run that draws noise on rank 1 at every step, a different amount each time; a run
  // resumed at step 5 (a fresh process: nothing drawn before) draws the same from there.
  auto noise = [](int64_t step) {
    Rng r = rank_stream(11, 1, step);
    std::vector<float> v;
    for (int i = 0; i < 3 + step; ++i) v.push_back(r.normal());
    return v;
  };
  std::vector<std::vector<float>> whole;
  for (int64_t step = 0; step < 10; ++step) whole.push_back(noise(step));
  for (int64_t step = 5; step < 10; ++step) CHECK(noise(step) == whole[static_cast<size_t>(step)]);
}
