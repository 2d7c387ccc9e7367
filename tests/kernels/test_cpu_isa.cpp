// The per-ISA copies of the CPU kernels (kernels/cpu/isa/): each path this CPU can run is
// checked against the FP64 reference of tests/kernels/gemm_case.h on odd shapes, in all
// four layouts, with bias and beta = 1; a path the CPU lacks is skipped with the features
// it misses (CTEST_SKIP, tests/CMakeLists.txt). Then the dispatch itself: forcing a path
// changes the code that runs, and a bad name or an unavailable path is a UsageError.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_convert.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa/element_blocks.h"
#include "tests/kernels/gemm_case.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::bits_of;
using belay::test::GemmCase;

namespace {

std::string missing_list(CpuIsa isa) {
  std::string s;
  for (const std::string& m : cpu_isa_missing(isa)) s += (s.empty() ? "" : ", ") + m;
  return s;
}

// Restores the active path when a test that forces one ends.
struct IsaRestore {
  CpuIsa saved = active_cpu_isa();
  ~IsaRestore() { force_cpu_isa(saved); }
};

void gemm_suite(CpuIsa isa) {
  if (!cpu_isa_available(isa)) {
    WARN("CTEST_SKIP: the " << cpu_isa_name(isa) << " path needs " << missing_list(isa)
                            << ", which this CPU lacks (it has: " << cpu_features_string() << ")");
    return;
  }
  INFO("path " << cpu_isa_name(isa));
  auto gemm = [isa](const GemmArgs& a) { cpu_gemm_on(isa, a); };
  // 1, 7, 129, 1000 in every role; K never a multiple of 32.
  // {600, 7, 300}: whole MC x KC blocks of A (288 rows per thread, K past one block), so a
  // panel written past its end runs off the packing buffer (found by ASan in the bench).
  const GemmCase shapes[] = {{1, 1, 1},    {7, 129, 1},     {129, 7, 13},   {1, 129, 7},     {7, 7, 1000},
                             {33, 1, 1023}, {1000, 7, 129}, {129, 1000, 33}, {600, 7, 300}};
  uint64_t seed = 700;
  for (DType in : {DType::F32, DType::F16, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const GemmCase& gc : shapes) test::run_gemm_case(gc, ta, tb, in, in, false, false, seed += 10, gemm);
  for (DType in : {DType::F32, DType::F16, DType::BF16}) {
    for (DType out : {DType::F32, DType::F16, DType::BF16}) {
      test::run_gemm_case({7, 129, 1000}, false, true, in, out, true, false, seed += 10, gemm);  // forward + bias
      test::run_gemm_case({129, 7, 13}, true, false, in, out, true, false, seed += 10, gemm);
    }
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        test::run_gemm_case({129, 1000, 7}, ta, tb, in, DType::F32, false, true, seed += 10, gemm);  // C += A B
        test::run_gemm_case({7, 129, 1000}, ta, tb, in, DType::F32, true, true, seed += 10, gemm);
        test::run_gemm_case({1, 1, 1}, ta, tb, in, DType::F32, true, true, seed += 10, gemm);
      }
  }
}

}  // namespace

TEST_CASE("cpu isa baseline: gemm against the FP64 reference, odd shapes, all layouts", "[kernels][cpu][isa]") {
  gemm_suite(CpuIsa::Baseline);
}
TEST_CASE("cpu isa avx2: gemm against the FP64 reference, odd shapes, all layouts", "[kernels][cpu][isa]") {
  gemm_suite(CpuIsa::Avx2);
}
TEST_CASE("cpu isa avx512: gemm against the FP64 reference, odd shapes, all layouts", "[kernels][cpu][isa]") {
  gemm_suite(CpuIsa::Avx512);
}

TEST_CASE("cpu isa avx512bf16: gemm against the FP64 reference, odd shapes, all layouts", "[kernels][cpu][isa]") {
  gemm_suite(CpuIsa::Avx512Bf16);
}

TEST_CASE("cpu isa avx512bf16: BF16 x BF16 runs VDPBF16PS, which flushes subnormal inputs", "[kernels][cpu][isa]") {
  if (!cpu_isa_available(CpuIsa::Avx512Bf16)) {
    WARN("CTEST_SKIP: the avx512bf16 path needs " << missing_list(CpuIsa::Avx512Bf16)
                                                  << ", which this CPU lacks (it has: " << cpu_features_string() << ")");
    return;
  }
  auto product = [](CpuIsa isa, const Tensor& a, const Tensor& b) {
    Tensor c = Tensor::empty(Shape{a.dim(0), b.dim(0)});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.trans_b = true;
    args.c = &c;
    cpu_gemm_on(isa, args);
    return c;
  };
  // The pairwise sums are another order than the FP32 panels' k by k: over K = 1000 some
  // bits differ from the avx512 path (equal bits everywhere: the pair kernel never ran) ...
  const Tensor a = test::gemm_random_tensor(Shape{37, 1000}, DType::BF16, 31);
  const Tensor b = test::gemm_random_tensor(Shape{45, 1000}, DType::BF16, 32);
  const std::vector<uint32_t> wide = bits_of(product(CpuIsa::Avx512, a, b));
  const std::vector<uint32_t> dot = bits_of(product(CpuIsa::Avx512Bf16, a, b));
  size_t differing = 0;
  for (size_t i = 0; i < wide.size(); ++i) differing += wide[i] != dot[i];
  INFO(differing << " of " << wide.size() << " elements differ in bits");
  CHECK(differing > 0);
  // ... and an FP32 product stays on the FP32 panels: the avx512 bits exactly.
  const Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
  CHECK(bits_of(product(CpuIsa::Avx512, a32, b32)) == bits_of(product(CpuIsa::Avx512Bf16, a32, b32)));
  // The documented difference: a BF16 subnormal (2^-130) reads as zero in VDPBF16PS, while
  // the FP32 panels widen it exactly; 2^-130 x 2^100 = 2^-30 is an ordinary FP32 value.
  const Tensor tiny = Tensor::full(Shape{1, 3}, std::ldexp(1.0f, -130), DType::BF16);
  const Tensor huge = Tensor::full(Shape{1, 3}, std::ldexp(1.0f, 100), DType::BF16);
  CHECK(product(CpuIsa::Avx512, tiny, huge).to_vector()[0] == std::ldexp(3.0f, -30));
  CHECK(product(CpuIsa::Avx512Bf16, tiny, huge).to_vector()[0] == 0.0f);
}

TEST_CASE("cpu isa: forcing a path switches the code the backend runs", "[kernels][cpu][isa]") {
  const CpuIsa best = best_cpu_isa();
  if (best == CpuIsa::Baseline) {
    WARN("CTEST_SKIP: only the baseline path runs here (cpu has: " << cpu_features_string() << ")");
    return;
  }
  IsaRestore restore;
  const Tensor a = test::gemm_random_tensor(Shape{129, 1000}, DType::F32, 11);
  const Tensor b = test::gemm_random_tensor(Shape{1000, 67}, DType::F32, 12);
  auto through_backend = [&](CpuIsa isa) {
    force_cpu_isa(isa);
    REQUIRE(active_cpu_isa() == isa);
    Tensor c = Tensor::empty(Shape{129, 67});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.c = &c;
    cpu_backend().gemm(args);
    return c;
  };
  auto direct = [&](CpuIsa isa) {
    Tensor c = Tensor::empty(Shape{129, 67});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.c = &c;
    cpu_gemm_on(isa, args);
    return c;
  };
  const Tensor c_base = through_backend(CpuIsa::Baseline), c_best = through_backend(best);
  // The backend runs the forced path: bit for bit what that path gives called directly.
  CHECK(bits_of(c_base) == bits_of(direct(CpuIsa::Baseline)));
  CHECK(bits_of(c_best) == bits_of(direct(best)));
  // The paths are different code (FMA vs separate multiply and add, other blockings), so
  // over K = 1000 some bits differ; equal bits everywhere would mean the linker merged the
  // copies into one (the failure shared/TOOLCHAIN.md describes).
  const std::vector<uint32_t> p = bits_of(c_base), q = bits_of(c_best);
  size_t differing = 0;
  for (size_t i = 0; i < p.size(); ++i) differing += p[i] != q[i];
  INFO("baseline vs " << cpu_isa_name(best) << ": " << differing << " of " << p.size() << " elements differ in bits");
  CHECK(differing > 0);
  // ... and both are within the tolerance of each other: each is within gamma_K (+ one
  // rounding) of the exact product, so their distance is within twice that, which is the
  // helper's bound for a reduction of length 2K + 1 (rel = (2K + 2) u32).
  std::vector<double> magnitude(p.size()), best_values(p.size());
  const std::vector<float> av = a.to_vector(), bv = b.to_vector(), bestv = c_best.to_vector();
  for (int64_t i = 0; i < 129; ++i)
    for (int64_t j = 0; j < 67; ++j) {
      double mag = 0.0;
      for (int64_t k = 0; k < 1000; ++k) mag += std::fabs(static_cast<double>(av[i * 1000 + k]) * bv[k * 67 + j]);
      magnitude[i * 67 + j] = mag;
      best_values[i * 67 + j] = bestv[i * 67 + j];
    }
  test::check_close(c_base.to_vector(), best_values, test::tolerance_for(DType::F32, DType::F32, 2 * 1000 + 1),
                    magnitude);
}

TEST_CASE("cpu isa: unknown names and paths the CPU lacks are UsageErrors", "[kernels][cpu][isa]") {
  CHECK_THROWS_AS(parse_cpu_isa("sse9"), UsageError);
  CHECK_THROWS_WITH(parse_cpu_isa("AVX2"), Catch::Contains("baseline, avx2, avx512 or avx512bf16"));
  CHECK_THROWS_AS(select_cpu_isa("avx1024"), UsageError);
  for (CpuIsa isa : kAllCpuIsas) CHECK(parse_cpu_isa(cpu_isa_name(isa)) == isa);
  CHECK(cpu_isa_available(CpuIsa::Baseline));
  CHECK(cpu_isa_available(best_cpu_isa()));
  // The report names the path in use and what the CPU has.
  CHECK_THAT(cpu_isa_report(), Catch::StartsWith(cpu_isa_name(active_cpu_isa())));
  CHECK_THAT(cpu_isa_line(), Catch::Contains("cpu has: "));
  for (CpuIsa isa : kAllCpuIsas) {
    if (cpu_isa_available(isa)) continue;
    IsaRestore restore;
    INFO("path " << cpu_isa_name(isa));
    CHECK_THROWS_AS(force_cpu_isa(isa), UsageError);
    CHECK_THROWS_WITH(force_cpu_isa(isa), Catch::Contains(cpu_isa_missing(isa).front()));
    CHECK(active_cpu_isa() == restore.saved);  // a refused request changes nothing
    Tensor a = Tensor::empty(Shape{2, 2}), c = Tensor::empty(Shape{2, 2});
    GemmArgs args;
    args.a = &a;
    args.b = &a;
    args.c = &c;
    CHECK_THROWS_AS(cpu_gemm_on(isa, args), Error);
  }
}

namespace {

// Inputs for the element kernels: ordinary values over many binades, and the specials.
std::vector<float> element_inputs(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, static_cast<int>(rng.next_u64() % 60) - 30);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 6e-8f, 1e-40f, -3e38f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[i * 7 % v.size()] = specials[i];
  return v;
}

void element_suite(CpuIsa isa) {
  if (!cpu_isa_available(isa)) {
    WARN("CTEST_SKIP: the " << cpu_isa_name(isa) << " path needs " << missing_list(isa)
                            << ", which this CPU lacks (it has: " << cpu_features_string() << ")");
    return;
  }
  INFO("path " << cpu_isa_name(isa) << " vs baseline");
  const ElementBlocks& base = cpu_element_blocks(CpuIsa::Baseline);
  const ElementBlocks& wide = cpu_element_blocks(isa);
  // Every 16-bit pattern widened: FP16 (signalling NaNs included) and BF16.
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wb(all.size()), ww(all.size());
  base.f16_to_f32(all.data(), wb.data(), 65536);
  wide.f16_to_f32(all.data(), ww.data(), 65536);
  CHECK(bits_of(wb) == bits_of(ww));
  base.bf16_to_f32(all.data(), wb.data(), 65536);
  wide.bf16_to_f32(all.data(), ww.data(), 65536);
  CHECK(bits_of(wb) == bits_of(ww));
  // FP32 narrowed, odd lengths (vector bodies and scalar tails).
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    INFO("n = " << n);
    const std::vector<float> x = element_inputs(n, 900 + static_cast<uint64_t>(n));
    std::vector<uint16_t> hb(x.size()), hw(x.size());
    base.f32_to_f16(x.data(), hb.data(), n);
    wide.f32_to_f16(x.data(), hw.data(), n);
    CHECK(hb == hw);
    base.f32_to_bf16(x.data(), hb.data(), n);
    wide.f32_to_bf16(x.data(), hw.data(), n);
    CHECK(hb == hw);
    // Unscale: the same products and the same finite verdict (1e30 * 1e10 overflows).
    std::vector<float> rb(x.size()), rw(x.size());
    for (const float inv : {0.5f, 1e10f, 3.1e-5f}) {
      const int bad_b = base.unscale(x.data(), rb.data(), n, inv), bad_w = wide.unscale(x.data(), rw.data(), n, inv);
      CHECK(bad_b == bad_w);
      CHECK(bits_of(rb) == bits_of(rw));
    }
    // AdamW: master, moments and the FP16 working copy, plain and non-temporal stores.
    for (const bool stream : {false, true}) {
      std::vector<float> g = element_inputs(n, 950 + static_cast<uint64_t>(n));
      for (float& e : g)
        if (!std::isfinite(e)) e = 1.0f;  // a non-finite gradient skips the step before AdamW runs
      std::vector<float> p0(x.size()), m0(x.size()), v0(x.size());
      Rng rng(77);
      for (size_t i = 0; i < x.size(); ++i) {
        p0[i] = rng.uniform(-1.0f, 1.0f);
        m0[i] = rng.uniform(-1e-3f, 1e-3f);
        v0[i] = rng.uniform(0.0f, 1e-6f);
      }
      auto run = [&](const ElementBlocks& k, std::vector<float>& p, std::vector<float>& m, std::vector<float>& v,
                     std::vector<uint16_t>& w) {
        p = p0, m = m0, v = v0;
        w.assign(x.size(), 0);
        AdamWBlock b{g.data(), p.data(), m.data(), v.data(), w.data(), n, 1.0f / 1024.0f, 0.75f, 1e-3f, 0.9f,
                     0.999f, 1e-8f, 0.19f, 0.0199f, 0.01f, stream};
        if (!k.adamw(b)) cvt_f32_to_f16(p.data(), w.data(), n);  // the caller's part on baseline
      };
      std::vector<float> pb, mb, vb, pw, mw, vw;
      std::vector<uint16_t> w_b, w_w;
      run(base, pb, mb, vb, w_b);
      run(wide, pw, mw, vw, w_w);
      INFO("stream " << stream);
      CHECK(bits_of(pb) == bits_of(pw));
      CHECK(bits_of(mb) == bits_of(mw));
      CHECK(bits_of(vb) == bits_of(vw));
      CHECK(w_b == w_w);
      CHECK(bits_of(pb) != bits_of(p0));  // the update did something
    }
  }
}

}  // namespace

TEST_CASE("cpu isa avx2: element kernels bit for bit the baseline's", "[kernels][cpu][isa]") {
  element_suite(CpuIsa::Avx2);
}
TEST_CASE("cpu isa avx512: element kernels bit for bit the baseline's", "[kernels][cpu][isa]") {
  element_suite(CpuIsa::Avx512);
}

TEST_CASE("cpu isa: the packed product's bits do not depend on the thread count", "[kernels][cpu][isa]") {
  // Each output's K products are summed in the same order whichever thread computes it
  // (threads take whole slices of C), so a resume with another OMP_NUM_THREADS repeats.
  // BF16 inputs too: on the avx512bf16 path they take the pair kernel.
  for (DType in : {DType::F32, DType::BF16}) {
  INFO("inputs " << dtype_name(in) << ", path " << cpu_isa_name(active_cpu_isa()));
  const Tensor a = test::gemm_random_tensor(Shape{300, 701}, in, 21);
  const Tensor b = test::gemm_random_tensor(Shape{500, 701}, in, 22);
  const int saved = omp_get_max_threads();
  auto product = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor c = Tensor::empty(Shape{300, 500});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.trans_b = true;
    args.c = &c;
    cpu_gemm_on(active_cpu_isa(), args);
    return bits_of(c);
  };
  const std::vector<uint32_t> one = product(1), two = product(2), three = product(3);
  omp_set_num_threads(saved);
  CHECK(one == two);
  CHECK(one == three);
  }
}
