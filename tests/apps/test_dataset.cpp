// The synthetic regression data (apps/dataset.cpp) against its definition, written here as a
// plain loop: x ~ N(0, 1) from stream 2 seed + 1; the teacher W [out][in] * 1/sqrt(in) and
// bias * 0.1 from stream 2 seed + 2; y = bias + the sum over i in index order, in double, of
// x W^T, rounded to FP32, plus 0.01 * noise drawn after x from the first stream. The generator
// runs it in tiles of several rows and outputs, a copy per vector ISA: every copy must give
// these bits (the products are exact in double, so only the order of the adds matters).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "apps/dataset.h"
#include "engine/backend.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/tolerance.h"

using namespace belay;

namespace {

// The definition, one batch after another from the same streams.
class Reference {
 public:
  Reference(int64_t in, int64_t out, uint64_t seed)
      : in_(in), out_(out), data_(seed * 2 + 1), w_(static_cast<size_t>(out * in)), b_(static_cast<size_t>(out)) {
    Rng teacher(seed * 2 + 2);
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    for (float& e : w_) e = s * teacher.normal();  // W [out][in], the stream's order
    for (float& e : b_) e = 0.1f * teacher.normal();
  }
  void next(int64_t batch, std::vector<float>& x, std::vector<float>& y) {
    x.assign(static_cast<size_t>(batch * in_), 0.0f);
    y.assign(static_cast<size_t>(batch * out_), 0.0f);
    for (float& v : x) v = data_.normal();
    for (int64_t r = 0; r < batch; ++r)
      for (int64_t o = 0; o < out_; ++o) {
        double acc = b_[o];
        for (int64_t i = 0; i < in_; ++i) acc += (double)x[r * in_ + i] * (double)w_[o * in_ + i];
        y[r * out_ + o] = static_cast<float>(acc);
      }
    for (float& v : y) v += 0.01f * data_.normal();
  }

 private:
  int64_t in_, out_;
  Rng data_;
  std::vector<float> w_, b_;
};

}  // namespace

TEST_CASE("synthetic data: every ISA path gives the definition's bits, tiles and edges included", "[apps][data]") {
  const CpuIsa saved = active_cpu_isa();
  // 45 outputs: two tiles of 16 (or five of 8) and the last ones one by one; 13 rows: a
  // partial tile of rows; 3 batches: the streams carry on from one batch to the next.
  const int64_t in = 37, out = 45, batch = 13;
  int paths = 0;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    INFO("path " << cpu_isa_name(isa));
    force_cpu_isa(isa);
    ++paths;
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
  force_cpu_isa(saved);
  CHECK(paths >= 1);
}
