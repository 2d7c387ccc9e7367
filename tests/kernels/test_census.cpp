// The guard's census (engine/census.h) on every CPU path this machine runs: each count against
// a plain reference that classifies through the format's own conversion (round_to), on
// tensors built to hit every case (values just above and below the smallest normal and
// subnormal and the round-to-zero tie, at several loss scales; exact zeros of both signs;
// inf, NaN; the largest finite), placed both in whole SIMD groups and in the scalar tail.
// The guard's own outputs keep their bits when the census is taken.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend.h"
#include "engine/census.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/cpu_guards.h"
#include "tests/kernels/census_case.h"

using namespace belay;
using belay::test::IsaRestore;
using belay::test::census_reference;
using belay::test::census_tensors;

namespace {

const Backend& cpu() { return cpu_backend(); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The census the backend writes, decoded.
std::vector<TensorCensus> census_of(const std::vector<const Tensor*>& grads, float inv, DType format, float* found,
                                    float* norm) {
  Tensor census = Tensor::empty(Shape{static_cast<int64_t>(grads.size()), kCensusFields}, DType::F32);
  Tensor f = Tensor::empty(Shape{1}), n = Tensor::empty(Shape{1});
  cpu().guard(grads, Tensor::scalar(inv), f, n, GuardCensus{&census, format});
  *found = f.item();
  *norm = n.item();
  const uint32_t* w = census.data_as<const uint32_t>();
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  for (const Tensor* g : grads) {
    names.push_back("t");
    numels.push_back(g->numel());
  }
  return decode_census(std::vector<uint32_t>(w, w + census.numel()), names, numels);
}

// Each tensor's counts against census_reference.
void check_against_reference(const std::vector<TensorCensus>& got, const std::vector<Tensor>& ts, DType format) {
  for (size_t t = 0; t < ts.size(); ++t) {
    INFO("tensor " << t << " of " << ts[t].numel() << " elements");
    const TensorCensus want = census_reference(ts[t], format);
    CHECK(got[t].nonfinite == want.nonfinite);
    CHECK(got[t].zeros == want.zeros);
    CHECK(got[t].underflow == want.underflow);
    CHECK(got[t].subnormal == want.subnormal);
    CHECK(bits(got[t].amax) == bits(want.amax));
  }
}

// The census of ts through the guard at inv, each count checked against census_reference, and
// the guard's found_inf and norm the same bits with the census as without. Returns found_inf.
float check_guard_census(const std::vector<Tensor>& ts, float inv, DType format) {
  std::vector<const Tensor*> grads;
  for (const Tensor& t : ts) grads.push_back(&t);
  float found = 0, norm = 0;
  const std::vector<TensorCensus> got = census_of(grads, inv, format, &found, &norm);
  Tensor f = Tensor::empty(Shape{1}), n = Tensor::empty(Shape{1});
  cpu().guard(grads, Tensor::scalar(inv), f, n);
  CHECK(bits(found) == bits(f.item()));
  CHECK(bits(norm) == bits(n.item()));
  REQUIRE(got.size() == ts.size());
  check_against_reference(got, ts, format);
  return found;
}

// body(format, grad_dtype) on every CPU path this machine has, for both census formats and every
// gradient dtype, at 1 and 2 threads; a failure says which.
template <class Body>
void on_every_batch_case(Body body) {
  IsaRestore restore;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    force_cpu_isa(isa);
    for (const DType format : {DType::F16, DType::BF16})
      for (const DType grad_dtype : {DType::F32, DType::F16, DType::BF16})
        for (const int threads : {1, 2}) {
          INFO(cpu_isa_name(isa) << ", census in " << dtype_name(format) << ", gradients " << dtype_name(grad_dtype)
                                 << ", " << threads << " thread(s)");
          belay::test::Threads with(threads);
          body(format, grad_dtype);
        }
  }
}

}  // namespace

TEST_CASE("guard census: every count against the reference, on every CPU path", "[census]") {
  IsaRestore restore;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;  // the paths this CPU lacks only compile here
    force_cpu_isa(isa);
    for (const DType format : {DType::F16, DType::BF16})
      for (const DType grad_dtype : {DType::F32, DType::F16, DType::BF16})
        for (const float scale : {1.0f, 1024.0f, 65536.0f}) {
          INFO(cpu_isa_name(isa) << ", census in " << dtype_name(format) << ", gradients " << dtype_name(grad_dtype)
                                 << ", scale " << scale);
          const std::vector<Tensor> ts = census_tensors(format, grad_dtype, scale, 7u);
          check_guard_census(ts, 1.0f / scale, format);
          // The cases are there to be hit: a census that counted nothing would pass nothing.
          const TensorCensus big = census_reference(ts[0], format);
          CHECK(big.nonfinite > 0);
          CHECK(big.zeros > 0);
          if (grad_dtype == DType::F32 || grad_dtype == format) CHECK(big.subnormal > 0);
          if (grad_dtype == DType::F32) CHECK(big.underflow > 0);
        }
  }
}

// The kernels' fast steps (plain values: only their min and max taken) beside sparse dirty
// ones, a clean group, and a group counted again for its one NaN.
TEST_CASE("guard census: mostly plain gradients, the fast steps and the recount, on every CPU path", "[census]") {
  IsaRestore restore;
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    force_cpu_isa(isa);
    for (const DType format : {DType::F16, DType::BF16})
      for (const DType grad_dtype : {DType::F32, DType::F16, DType::BF16}) {
        INFO(cpu_isa_name(isa) << ", census in " << dtype_name(format) << ", gradients " << dtype_name(grad_dtype));
        const std::vector<Tensor> ts = belay::test::census_sparse_tensors(format, grad_dtype, 11u);
        check_guard_census(ts, 1.0f / 256.0f, format);
        const TensorCensus big = census_reference(ts[0], format), clean = census_reference(ts[1], format);
        CHECK(big.nonfinite == 1);
        CHECK(big.zeros > 0);
        CHECK(big.amax == 4096.0f);
        CHECK(clean.nonfinite + clean.zeros + clean.underflow + clean.subnormal == 0);
      }
  }
}

// Small gradients, each under one group of 8 chunks, so the guard reads them in batches of
// chunks from several gradients, in rounds as long as a batch's shortest unread chunk
// (kernels/cpu/guard_kernels.cpp), in blocks of 128 values: plain ones (only their largest
// magnitude counted), ones with the edge values planted on both sides of a block's end (512,
// 1024), one with an inf and one with a NaN; each counted against the reference, on every path,
// at 1 and 2 threads.
TEST_CASE("guard census: batched small gradients, plain and edged, on every CPU path", "[census]") {
  on_every_batch_case([](DType format, DType grad_dtype) {
    const std::vector<float> edges = belay::test::census_edge_values(format);
    Rng rng(17);
    std::vector<Tensor> ts;
    int made = 0;
    for (const int64_t n : {int64_t{16384}, int64_t{128}, int64_t{1030}, int64_t{16384}, int64_t{9000},
                            int64_t{600}, int64_t{16384}, int64_t{37}, int64_t{5000}, int64_t{16384}}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& e : x) e = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.uniform() * 20.0f) - 10);
      const int kind = made++ % 4;  // 0, 2: plain; 1: edges around 511 and 1023; 3: edges and one NaN or inf
      if (kind % 2 == 1)
        for (size_t k = 0; k < edges.size(); ++k) {
          const float v = edges[k];
          if (kind == 1 && !std::isfinite(v)) continue;
          x[(509 + 3 * k) % x.size()] = v;
          x[(1020 + 5 * k) % x.size()] = v;
        }
      ts.push_back(Tensor::from_vector(x, Shape{n}).to(grad_dtype));
    }
    // Each edge value alone in a plain gradient, in a later block (1408-1535): that
    // block's scan alone must send it to the recount.
    for (const float e : edges) {
      std::vector<float> x(2100);
      for (float& v : x) v = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.uniform() * 20.0f) - 10);
      x[1500] = e;
      ts.push_back(Tensor::from_vector(x, Shape{2100}).to(grad_dtype));
    }
    CHECK(check_guard_census(ts, 1.0f / 64.0f, format) == 1.0f);  // the planted inf and NaN
    const TensorCensus plain = census_reference(ts[0], format), edged = census_reference(ts[1], format);
    CHECK(plain.nonfinite + plain.zeros + plain.underflow + plain.subnormal == 0);
    CHECK(edged.zeros > 0);
  });
}

// Small gradients thick with values below the normal range: an edge value every 37 from
// `start` on (those finite in grad_dtype: FP32's largest is inf in FP16; one gradient keeps
// the inf and NaN too), the largest ordinary value at x[3], and edge values at x[1023] and
// the last element (a block's and a gradient's last).
namespace {

std::vector<Tensor> thick_gradients(DType format, DType grad_dtype, int64_t start) {
  std::vector<float> edges;
  for (const float e : belay::test::census_edge_values(format))
    if (!std::isfinite(e) || std::isfinite(Tensor::from_vector({e}, Shape{1}).to(grad_dtype).to(DType::F32).item()))
      edges.push_back(e);
  Rng rng(23);
  std::vector<Tensor> ts;
  int made = 0;
  for (const int64_t n : {int64_t{3000}, int64_t{2100}, int64_t{1030}, int64_t{2500}, int64_t{700}, int64_t{1800},
                          int64_t{1100}, int64_t{4100}, int64_t{999}, int64_t{129}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.uniform() * 20.0f) - 10);
    x[3] = 3000.0f;  // larger than any other finite value but the edges' largest
    const bool with_nonfinite = made++ == 4;
    for (int64_t i = start + 5, e = 0; i < n; i += 37, ++e) {
      const float v = edges[static_cast<size_t>(e) % edges.size()];
      if (std::isfinite(v) || with_nonfinite) x[static_cast<size_t>(i)] = v;
    }
    x[static_cast<size_t>(n - 1)] = edges[2];
    x[static_cast<size_t>(std::min<int64_t>(1023, n - 2))] = edges[3];
    ts.push_back(Tensor::from_vector(x, Shape{n}).to(grad_dtype));
  }
  return ts;
}

}  // namespace

// The batches count such gradients in the loop (ColumnCounts), from the second block on, or
// from a later block where the first ones are plain and hold the largest value.
TEST_CASE("guard census: batched small gradients thick with edge values, on every CPU path", "[census]") {
  on_every_batch_case([](DType format, DType grad_dtype) {
    for (const int64_t start : {int64_t{0}, int64_t{300}}) {
      INFO("edges from " << start);
      check_guard_census(thick_gradients(format, grad_dtype, start), 1.0f / 64.0f, format);
    }
  });
}

// A batch that turns dense and back: 8 gradients whose first block is thick with the small edge
// values (every chunk flagged: the next block is counted in the loop), then plain blocks (the
// loop turns back to the scan), the largest value in a plain block after the dense one, and lone
// small edge values in later blocks of two gradients, which the scan must send to the recount;
// one gradient holds an inf late. Every path, 1 and 2 threads.
TEST_CASE("guard census: a batch turns dense and back, on every CPU path", "[census]") {
  on_every_batch_case([](DType format, DType grad_dtype) {
    std::vector<float> edges;  // those below 1 in magnitude: zeros, the subnormals and the normal edge
    for (const float e : belay::test::census_edge_values(format))
      if (std::fabs(e) < 1.0f) edges.push_back(e);
    Rng rng(31);
    std::vector<Tensor> ts;
    for (int t = 0; t < 8; ++t) {
      std::vector<float> x(static_cast<size_t>(2000 + 50 * t));
      for (float& e : x) e = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.uniform() * 20.0f) - 10);
      for (size_t i = static_cast<size_t>(t), e = 0; i < 128; i += 9, ++e) x[i] = edges[e % edges.size()];
      x[900] = 3000.0f;  // the largest finite value, in a plain block after the dense one
      if (t == 2 || t == 5) x[1500 + static_cast<size_t>(t)] = edges[static_cast<size_t>(t) % edges.size()];
      if (t == 7) x[1900] = INFINITY;
      ts.push_back(Tensor::from_vector(x, Shape{static_cast<int64_t>(x.size())}).to(grad_dtype));
    }
    CHECK(check_guard_census(ts, 1.0f / 64.0f, format) == 1.0f);  // the planted inf
  });
}

TEST_CASE("guard census: headroom in bits and the record's checks", "[census]") {
  TensorCensus c;
  c.amax = 65504.0f / 8.0f;
  CHECK(c.headroom_bits(DType::F16) == Approx(3.0).epsilon(0));
  c.amax = 0.0f;
  CHECK(std::isinf(c.headroom_bits(DType::F16)));
  Tensor g = Tensor::zeros(Shape{4});
  Tensor f = Tensor::empty(Shape{1}), n = Tensor::empty(Shape{1});
  Tensor wrong = Tensor::empty(Shape{2, kCensusFields});
  CHECK_THROWS_WITH(cpu().guard({&g}, Tensor::scalar(1.0f), f, n, GuardCensus{&wrong, DType::F16}),
                    Catch::Contains("one record per gradient"));
  Tensor right = Tensor::empty(Shape{1, kCensusFields});
  CHECK_THROWS_WITH(cpu().guard({&g}, Tensor::scalar(1.0f), f, n, GuardCensus{&right, DType::F32}),
                    Catch::Contains("FP16 or BF16"));
}
