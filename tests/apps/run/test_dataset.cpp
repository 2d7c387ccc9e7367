// The synthetic regression data (apps/run/dataset.cpp, version 2) against its definition,
// written here as plain loops. Row n of x: word w = mix64(key_x + (n * ceil(in / 2) + w) *
// golden), key_x = stream_seed(seed, 'x'), gives values 2w (bits 63..40) and 2w + 1 (bits
// 39..16), each k -> sqrt(3) * (2k + 1 - 2^24) / 2^24. The teacher: V [16][in] * 1/sqrt(in),
// U [out][16] * 0.25 and b * 0.1 from stream 2 seed + 2 in that order; h = V x in double, rounded
// to FP32; y = b + U h in double, rounded to FP32, plus 0.01 times the noise, drawn as x
// with key 'n'. The generator runs it in a copy per vector ISA: every copy must give these bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "apps/run/dataset.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/tolerance.h"

using namespace belay;

namespace {

std::vector<float> definition_uniforms(uint64_t key, int64_t n, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  const int64_t words = (count + 1) / 2;
  for (int64_t j = 0; j < count; ++j) {
    const uint64_t bits = mix64(key + static_cast<uint64_t>(n * words + j / 2) * 0x9e3779b97f4a7c15ull);
    const double k = static_cast<double>(j % 2 == 0 ? bits >> 40 : (bits >> 16) & 0xffffff);
    v[j] = static_cast<float>((2.0 * k + 1.0 - 16777216.0) / 16777216.0 * static_cast<double>(1.7320508f));
  }
  return v;
}

// The definition, row after row.
class Reference {
 public:
  Reference(int64_t in, int64_t out, uint64_t seed)
      : in_(in), out_(out), xkey_(stream_seed(seed, 'x')), nkey_(stream_seed(seed, 'n')) {
    Rng teacher(seed * 2 + 2);
    v_.resize(static_cast<size_t>(16 * in));
    u_.resize(static_cast<size_t>(out * 16));
    b_.resize(static_cast<size_t>(out));
    for (float& e : v_) e = (1.0f / std::sqrt(static_cast<float>(in))) * teacher.normal();  // V [16][in]
    for (float& e : u_) e = 0.25f * teacher.normal();                                      // U [out][16]
    for (float& e : b_) e = 0.1f * teacher.normal();
  }
  void next(int64_t batch, std::vector<float>& x, std::vector<float>& y) {
    x.clear();
    y.clear();
    for (int64_t r = 0; r < batch; ++r, ++row_) {
      const std::vector<float> xr = definition_uniforms(xkey_, row_, in_), noise = definition_uniforms(nkey_, row_, out_);
      x.insert(x.end(), xr.begin(), xr.end());
      float h[16];
      for (int64_t k = 0; k < 16; ++k) {
        double acc = 0;
        for (int64_t i = 0; i < in_; ++i) acc += (double)xr[i] * (double)v_[k * in_ + i];
        h[k] = static_cast<float>(acc);
      }
      for (int64_t o = 0; o < out_; ++o) {
        double acc = b_[o];
        for (int64_t k = 0; k < 16; ++k) acc += (double)h[k] * (double)u_[o * 16 + k];
        y.push_back(static_cast<float>(acc) + 0.01f * noise[o]);
      }
    }
  }

 private:
  int64_t in_, out_;
  uint64_t xkey_, nkey_;
  int64_t row_ = 0;
  std::vector<float> v_, u_, b_;
};

}  // namespace

TEST_CASE("synthetic data: every ISA path gives the definition's bits, batch after batch", "[apps][data]") {
  const CpuIsa saved = active_cpu_isa();
  // 37 inputs and 45 outputs (odd counts: a last half word; 45 = two blocks of 16 and a
  // part); 3 batches: the rows carry on from one batch to the next; 300 x 301 at batch 300
  // crosses the threading threshold; 5 x 3: fewer features than the teacher's rank.
  int paths = 0;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    INFO("path " << cpu_isa_name(isa));
    force_cpu_isa(isa);
    ++paths;
    for (const auto& [in, out, batch] : {std::tuple<int64_t, int64_t, int64_t>{37, 45, 13}, {300, 301, 300}, {5, 3, 4}}) {
      const std::unique_ptr<Dataset> d = make_synthetic_regression(in, out, 7);
      Reference ref(in, out, 7);
      std::vector<float> x, y;
      for (int b = 0; b < 3; ++b) {
        const Batch got = d->next(batch, Device::cpu());
        ref.next(batch, x, y);
        CHECK(test::bits_of(got.x) == test::bits_of(x));
        CHECK(test::bits_of(got.y) == test::bits_of(y));
      }
    }
  }
  force_cpu_isa(saved);
  CHECK(paths >= 1);
}

TEST_CASE("synthetic data: x has mean 0 and variance 1, the teacher's outputs have variance about 1", "[apps][data]") {
  const std::unique_ptr<Dataset> d = make_synthetic_regression(256, 64, 3);
  const Batch b = d->next(512, Device::cpu());
  const std::vector<float> x = b.x.to_vector(), y = b.y.to_vector();
  double sx = 0, sxx = 0, sy = 0, syy = 0;
  for (float v : x) sx += v, sxx += (double)v * v;
  for (float v : y) sy += v, syy += (double)v * v;
  const double n = static_cast<double>(x.size()), m = static_cast<double>(y.size());
  // 131072 draws: the standard error of the mean is 1/362, of the variance about 1/400.
  CHECK(std::abs(sx / n) < 0.02);
  CHECK(std::abs(sxx / n - 1.0) < 0.02);
  // y: 32768 values whose variance is |U_o|^2 |V x|^2-ish plus b^2: near 1, nowhere near 0 or 10.
  const double var_y = syy / m - (sy / m) * (sy / m);
  CHECK(var_y > 0.5);
  CHECK(var_y < 2.0);
}

TEST_CASE("synthetic data: the position is the rows drawn, resuming there continues the bits", "[apps][data]") {
  const std::unique_ptr<Dataset> a = make_synthetic_regression(9, 4, 11);
  a->next(6, Device::cpu());
  CHECK(a->position() == "synthetic.v2 rows 6");
  const std::unique_ptr<Dataset> b = make_synthetic_regression(9, 4, 11);
  b->set_position(a->position());
  CHECK(test::bits_of(a->next(5, Device::cpu()).y) == test::bits_of(b->next(5, Device::cpu()).y));
  // Batches of any size draw the same rows: 2 + 3 rows are the 5 rows of one batch.
  const std::unique_ptr<Dataset> c = make_synthetic_regression(9, 4, 11), e = make_synthetic_regression(9, 4, 11);
  std::vector<uint32_t> two = test::bits_of(c->next(2, Device::cpu()).x), three = test::bits_of(c->next(3, Device::cpu()).x);
  two.insert(two.end(), three.begin(), three.end());
  CHECK(two == test::bits_of(e->next(5, Device::cpu()).x));
}

TEST_CASE("synthetic data: a version-1 position (64 hex digits) is refused with one clear line", "[apps][data]") {
  const std::unique_ptr<Dataset> d = make_synthetic_regression(9, 4, 11);
  const std::string v1 = Rng(23).state_hex();
  REQUIRE(v1.size() == 64);
  CHECK_THROWS_WITH(d->set_position(v1), Catch::Contains("first data generator") && Catch::Contains("start a new run"));
  CHECK_THROWS_AS(d->set_position("synthetic.v2 rows x"), UsageError);
  CHECK_THROWS_AS(d->set_position("synthetic.v2 rows "), UsageError);
  CHECK_THROWS_AS(d->set_position("12"), UsageError);
}
