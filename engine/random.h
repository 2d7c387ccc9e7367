// A small deterministic random generator (xoshiro256**, seeded through splitmix64) with
// its own normal sampler. std::normal_distribution is implementation-defined; this is not,
// so data and initial weights are the same on every machine, and the state (four words)
// fits in a checkpoint for a bit-exact resume.
//
// Streams under data parallelism. Two kinds, and a run must say which it draws from:
//  - shared streams, the same on every rank: the initial weights and the synthetic data
//    (every rank draws the whole effective batch and keeps its slice, so N ranks see the
//    rows one process would). Seeded by the run's seed; their state is replicated, so a
//    checkpoint written by rank 0 holds it for all.
//  - rank streams, different on every rank: what must not repeat across ranks (dropout
//    masks, augmentation noise). rank_stream(seed, rank, step) derives a fresh generator
//    from those three numbers alone: no rank's state needs saving (rank 0 could not see
//    it), the seed and the step a checkpoint records resume it bit for bit, and nothing
//    drawn at one step shifts what another step draws.
#pragma once
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace belay {

// splitmix64's finaliser: a bijection of 64-bit words whose outputs for neighbouring inputs
// look unrelated (seed 1 and seed 2 give unrelated streams).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The seed of stream (a, b, c) of `seed`: the ids are hashed in one at a time, so
// (seed, 1, 0) and (seed, 0, 1) differ, as do (seed, r, s) and (seed + 1, r, s).
inline uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (uint64_t id : {a, b, c}) h = mix64(h ^ (id + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  void reseed(uint64_t seed) {
    for (auto& w : state_) {
      seed += 0x9e3779b97f4a7c15ull;
      w = mix64(seed);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 24 random bits: exactly representable in FP32.
  float uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }

  // Standard normal by Box-Muller in double, one value per call (no cached pair, so the
  // state alone describes the generator).
  float normal() {
    const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

  std::array<uint64_t, 4> state() const { return state_; }
  void set_state(const std::array<uint64_t, 4>& s) { state_ = s; }

  // The state as 64 lowercase hex digits (how checkpoints store it), and back: false (and
  // the generator unchanged) for anything else.
  std::string state_hex() const {
    char buf[72];
    std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, state_[0], state_[1],
                  state_[2], state_[3]);
    return buf;
  }
  bool set_state_hex(const std::string& hex) {
    if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
    for (int i = 0; i < 4; ++i) state_[i] = std::stoull(hex.substr(i * 16, 16), nullptr, 16);
    return true;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> state_{};
};

// What checkpoints record of how rank streams are derived: a resume under another
// derivation would draw other noise, so it is refused (amp/checkpoint.h).
inline constexpr const char* kRankStreamDerivation = "rank_stream.v1 (xoshiro256** seeded by stream_seed(seed, 'rank', rank, step))";

// The generator of `rank` at `step` of a run seeded with `seed` (see above). Ranks differ
// from each other and from every shared stream; the same three numbers give the same bits
// on every machine.
inline Rng rank_stream(uint64_t seed, int rank, int64_t step) {
  constexpr uint64_t kRankTag = 0x6b6e6172;  // "rank": keeps these apart from other derived streams
  return Rng(stream_seed(seed, kRankTag, static_cast<uint64_t>(rank), static_cast<uint64_t>(step)));
}

}  // namespace belay
