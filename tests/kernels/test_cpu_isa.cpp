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
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/random.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_convert.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa/element_blocks.h"
#include "kernels/cpu/isa/erf_exp.h"
#include "tests/kernels/cpu_guards.h"
#include "tests/kernels/gemm_case.h"
#include "tests/kernels/gelu_tanh_reference.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::IsaRestore;
using belay::test::bits_of;
using belay::test::GemmCase;

namespace {

std::string missing_list(CpuIsa isa) {
  std::string s;
  for (const std::string& m : cpu_isa_missing(isa)) s += (s.empty() ? "" : ", ") + m;
  return s;
}

// False, with the CTEST_SKIP warning naming what the CPU lacks, when the path cannot run here.
bool runs_here(CpuIsa isa) {
  if (cpu_isa_available(isa)) return true;
  WARN("CTEST_SKIP: the " << cpu_isa_name(isa) << " path needs " << missing_list(isa)
                          << ", which this CPU lacks (it has: " << cpu_features_string() << ")");
  return false;
}

// Restores the active path when a test that forces one ends.
// The odd-shape suite through `gemm`, for inputs of the given dtypes.
void gemm_cases(const std::function<void(const GemmArgs&)>& gemm, const std::vector<DType>& dtypes) {
  // 1, 7, 129, 1000 in every role; K never a multiple of 32.
  // {600, 7, 300}: whole MC x KC blocks of A (288 rows per thread, K past one block), so a
  // panel written past its end runs off the packing buffer (found by ASan in the bench).
  const GemmCase shapes[] = {{1, 1, 1},    {7, 129, 1},     {129, 7, 13},   {1, 129, 7},     {7, 7, 1000},
                             {33, 1, 1023}, {1000, 7, 129}, {129, 1000, 33}, {600, 7, 300}};
  uint64_t seed = 700;
  for (DType in : dtypes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const GemmCase& gc : shapes) test::run_gemm_case(gc, ta, tb, in, in, false, false, seed += 10, gemm);
  for (DType in : dtypes) {
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

void gemm_suite(CpuIsa isa) {
  if (!runs_here(isa)) return;
  INFO("path " << cpu_isa_name(isa));
  gemm_cases([isa](const GemmArgs& a) { cpu_gemm_on(isa, a); }, {DType::F32, DType::F16, DType::BF16});
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
  if (!runs_here(CpuIsa::Avx512Bf16)) return;
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

TEST_CASE("cpu isa amx: gemm against the FP64 reference, odd shapes, all layouts", "[kernels][cpu][isa]") {
  gemm_suite(CpuIsa::Amx);
}

// The amx path's own code (kernels/cpu/isa/gemm_amx.cpp: packing into tiles, the tile
// loop, the edges, the K blocks, the threads) on the emulator of the tile instructions, on
// every CPU: BF16 x BF16, the only products that path sends to tiles. The emulator counts
// anything the hardware would fault on; none may happen.
TEST_CASE("cpu isa amx (emulated tiles): BF16 gemm against the FP64 reference, odd shapes, all layouts",
          "[kernels][cpu][isa]") {
  amx_emulator_reset_faults();
  gemm_cases(cpu_gemm_amx_emulated, {DType::BF16});
  INFO("first fault: " << amx_emulator_first_fault());
  CHECK(amx_emulator_faults() == 0);
  // K past one block (1100 > 1024: two K blocks of 576, N blocks of 1344) with accumulation: the
  // blocks' sums chain through C. Then K = 1000 as one block (depth 1024: N blocks of 768), N
  // across three of them.
  test::run_gemm_case({70, 2100, 1100}, false, true, DType::BF16, DType::F32, true, true, 9001,
                      cpu_gemm_amx_emulated);
  test::run_gemm_case({40, 1600, 1000}, true, false, DType::BF16, DType::F32, true, true, 9002,
                      cpu_gemm_amx_emulated);
  CHECK(amx_emulator_faults() == 0);
  // Another dtype is refused, not widened silently.
  const Tensor a = test::gemm_random_tensor(Shape{4, 4}, DType::F32, 1);
  Tensor c = Tensor::empty(Shape{4, 4});
  GemmArgs args;
  args.a = &a;
  args.b = &a;
  args.c = &c;
  CHECK_THROWS_WITH(cpu_gemm_amx_emulated(args), Catch::Contains("BF16 x BF16"));
}

namespace {
// The amx path's BF16 product on the emulated tiles and, where the CPU has AMX, on the real ones.
std::vector<std::pair<const char*, std::function<void(const GemmArgs&)>>> amx_products() {
  std::vector<std::pair<const char*, std::function<void(const GemmArgs&)>>> products{{"emulated", cpu_gemm_amx_emulated}};
  if (cpu_isa_available(CpuIsa::Amx))
    products.push_back({"tiles", [](const GemmArgs& a) { cpu_gemm_on(CpuIsa::Amx, a); }});
  return products;
}
}  // namespace

// The packing buffers are the thread's and kept between products: the zeros past K (and past a
// panel's rows and columns) must be written by every product, never left from the one before.
// A product of NaN operands (K = 64) fills them; the next (K = 37: depth 64, k 37-63 padding)
// must give the bits it gives after a finite product, and finite values. Both of A's layouts
// (rows along k; a dW-shaped transposed A), small enough to run on the calling thread alone.
TEST_CASE("cpu isa amx: the tiles' padding is zeros whatever the packing buffers held before", "[kernels][cpu][isa]") {
  amx_emulator_reset_faults();
  const auto products = amx_products();
  const int64_t m = 30, n = 33;
  auto product = [&](const std::function<void(const GemmArgs&)>& gemm, bool trans_a, int64_t k, bool nan) {
    Tensor a = test::gemm_random_tensor(trans_a ? Shape{k, m} : Shape{m, k}, DType::BF16, 51);
    Tensor b = test::gemm_random_tensor(Shape{k, n}, DType::BF16, 52);
    if (nan)
      for (Tensor* t : {&a, &b})
        for (int64_t i = 0; i < t->numel(); ++i) t->data_as<uint16_t>()[i] = 0x7fc0;  // BF16 quiet NaN
    Tensor c = Tensor::empty(Shape{m, n});
    GemmArgs args;
    args.a = &a;
    args.b = &b;
    args.trans_a = trans_a;
    args.c = &c;
    gemm(args);
    return c;
  };
  for (const auto& [name, gemm] : products)
    for (const bool trans_a : {false, true}) {
      INFO(name << (trans_a ? ", A transposed" : ", A as rows"));
      product(gemm, trans_a, 64, false);
      const Tensor after_finite = product(gemm, trans_a, 37, false);
      product(gemm, trans_a, 64, true);
      const Tensor after_nan = product(gemm, trans_a, 37, false);
      for (float v : after_nan.to_vector()) REQUIRE(std::isfinite(v));
      CHECK(bits_of(after_nan) == bits_of(after_finite));
    }
  CHECK(amx_emulator_faults() == 0);
}

// A BF16 C that the tiles round themselves (one K block, nothing accumulated into C) has the
// bits of the FP32 C's cast: the bias added first, each output rounded once; edges, a forward
// (B transposed) and a dW-shaped product (A transposed), on the emulator and, where the CPU has
// AMX, on the real tiles. K = 1100 is past one block: C goes through FP32 as before.
TEST_CASE("cpu isa amx: a BF16 C rounded by the tiles has the bits of the FP32 C's cast", "[kernels][cpu][isa]") {
  amx_emulator_reset_faults();
  const auto products = amx_products();
  struct Case {
    int64_t m, n, k;
    bool trans_a, trans_b, bias;
  };
  for (const auto& [name, gemm] : products)
    for (const Case& cs : {Case{70, 100, 1000, false, true, true}, Case{33, 65, 7, false, true, false},
                           Case{64, 96, 130, true, false, false}, Case{40, 50, 1100, false, true, true}}) {
      INFO(name << ": " << cs.m << " x " << cs.n << " x " << cs.k);
      const Tensor a = test::gemm_random_tensor(cs.trans_a ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k}, DType::BF16, 41);
      const Tensor b = test::gemm_random_tensor(cs.trans_b ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n}, DType::BF16, 42);
      const Tensor bias = test::gemm_random_tensor(Shape{cs.n}, DType::F32, 43);
      Tensor c32 = Tensor::empty(Shape{cs.m, cs.n}), c16 = Tensor::empty(Shape{cs.m, cs.n}, DType::BF16);
      GemmArgs args;
      args.a = &a;
      args.b = &b;
      args.trans_a = cs.trans_a;
      args.trans_b = cs.trans_b;
      args.bias = cs.bias ? &bias : nullptr;
      args.c = &c32;
      gemm(args);
      args.c = &c16;
      gemm(args);
      CHECK(bits_of(c16) == bits_of(c32.to(DType::BF16)));
    }
  CHECK(amx_emulator_faults() == 0);
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
  // copies into one (the failure docs/toolchain.md describes).
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
  CHECK_THROWS_WITH(parse_cpu_isa("AVX2"), Catch::Contains("baseline, avx2, avx512, avx512bf16 or amx"));
  CHECK_THROWS_AS(select_cpu_isa("avx1024"), UsageError);
  for (CpuIsa isa : kAllCpuIsas) CHECK(parse_cpu_isa(cpu_isa_name(isa)) == isa);
  CHECK(cpu_isa_available(CpuIsa::Baseline));
  CHECK(cpu_isa_available(best_cpu_isa()));
  // The widest path the CPU runs is the one picked, amx included: no wider path is available.
  for (CpuIsa isa : kAllCpuIsas)
    if (static_cast<int>(isa) > static_cast<int>(best_cpu_isa())) CHECK_FALSE(cpu_isa_available(isa));
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

// The guard's sums of chunks anywhere (sum_squares_8_at): the chunks `stride` apart read
// through 8 pointers, shuffled, at lengths that are no multiple of 8: each lane its chunk's
// sequential sum, the baseline's bits and the sum taken one element at a time. x holds the
// values (h their FP16 or BF16 patterns where elem is one).
void check_sums_at(const ElementBlocks& base, const ElementBlocks& wide, const void* data, GemmElem elem,
                   int64_t stride, const std::vector<float>& x, const std::vector<uint16_t>& h) {
  auto dbits = [](double d) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
  };
  const size_t elem_size = elem == GemmElem::F32 ? 4 : 2;
  const int order[8] = {3, 0, 7, 5, 1, 6, 2, 4};
  const void* at[8];
  for (int k = 0; k < 8; ++k) at[k] = static_cast<const char*>(data) + order[k] * stride * static_cast<int64_t>(elem_size);
  for (const int64_t n : {int64_t{0}, int64_t{5}, int64_t{997}}) {
    double sb[8] = {}, sw[8] = {};  // the sums are added onto
    base.sum_squares_8_at(at, elem, n, 1.0f / 1024.0f, sb);
    wide.sum_squares_8_at(at, elem, n, 1.0f / 1024.0f, sw);
    for (int k = 0; k < 8; ++k) {
      double want = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = static_cast<size_t>(order[k] * stride + j);
        const float e = elem == GemmElem::F32 ? x[i] : elem == GemmElem::F16 ? f16_bits_to_f32(h[i]) : bf16_bits_to_f32(h[i]);
        const float u = e * (1.0f / 1024.0f);
        want += (double)u * (double)u;
      }
      INFO("at, length " << n << ", lane " << k);
      CHECK(dbits(sb[k]) == dbits(want));
      CHECK(dbits(sw[k]) == dbits(want));
    }
  }
}

void element_suite(CpuIsa isa) {
  if (!runs_here(isa)) return;
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
    // LayerNorm rows: y, mean, rstd, dx and the dw/db accumulators (16 lanes in a fixed order).
    {
      Rng rng(88);
      std::vector<float> xr(x.size()), dy(x.size()), w(x.size()), b(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xr[i] = rng.uniform(-3.0f, 5.0f), dy[i] = rng.uniform(-1.0f, 1.0f);
        w[i] = rng.uniform(0.5f, 1.5f), b[i] = rng.uniform(-1.0f, 1.0f);
      }
      std::vector<float> yb(x.size()), yw(x.size()), dxb(x.size()), dxw(x.size());
      std::vector<double> dwb(x.size(), 0.5), dww(x.size(), 0.5), dbb(x.size(), 0.25), dbw(x.size(), 0.25);
      float mb = 0, rb0 = 0, mw = 0, rw0 = 0;
      base.layer_norm_row(xr.data(), w.data(), b.data(), n, 1e-5f, yb.data(), &mb, &rb0);
      wide.layer_norm_row(xr.data(), w.data(), b.data(), n, 1e-5f, yw.data(), &mw, &rw0);
      CHECK(bits_of(yb) == bits_of(yw));
      CHECK(bits_of(std::vector<float>{mb, rb0}) == bits_of(std::vector<float>{mw, rw0}));
      base.layer_norm_row_backward(xr.data(), dy.data(), w.data(), n, mb, rb0, dxb.data(), dwb.data(), dbb.data());
      wide.layer_norm_row_backward(xr.data(), dy.data(), w.data(), n, mb, rb0, dxw.data(), dww.data(), dbw.data());
      CHECK(bits_of(dxb) == bits_of(dxw));
      CHECK(dwb == dww);  // doubles: == compares every bit of a finite value
      CHECK(dbb == dbw);
      // Softmax rows, plain and log, all columns live and the first (n + 1) / 2 only (causal).
      for (const bool log : {false, true})
        for (const int64_t live : {n, (n + 1) / 2}) {
          INFO((log ? "log_softmax" : "softmax") << " live " << live);
          base.softmax_row(xr.data(), yb.data(), n, live, log);
          wide.softmax_row(xr.data(), yw.data(), n, live, log);
          CHECK(bits_of(yb) == bits_of(yw));
          base.softmax_row_backward(yb.data(), dy.data(), dxb.data(), n, live, log);
          wide.softmax_row_backward(yb.data(), dy.data(), dxw.data(), n, live, log);
          CHECK(bits_of(dxb) == bits_of(dxw));
        }
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
    // SGD: master and momentum buffer, with and without momentum.
    for (const bool with_momentum : {false, true}) {
      std::vector<float> g = element_inputs(n, 960 + static_cast<uint64_t>(n));
      for (float& e : g)
        if (!std::isfinite(e)) e = 1.0f;
      std::vector<float> p0(x.size()), buf0(x.size());
      Rng rng(78);
      for (size_t i = 0; i < x.size(); ++i) {
        p0[i] = rng.uniform(-1.0f, 1.0f);
        buf0[i] = rng.uniform(-1e-2f, 1e-2f);
      }
      auto run = [&](const ElementBlocks& k, std::vector<float>& p, std::vector<float>& buf) {
        p = p0, buf = buf0;
        k.sgd(SgdBlock{g.data(), p.data(), with_momentum ? buf.data() : nullptr, n, 1.0f / 1024.0f, 0.75f, 1e-2f,
                       0.9f, 0.01f});
      };
      std::vector<float> pb, bb, pw, bw;
      run(base, pb, bb);
      run(wide, pw, bw);
      INFO("momentum " << with_momentum);
      CHECK(bits_of(pb) == bits_of(pw));
      CHECK(bits_of(bb) == bits_of(bw));
      CHECK(bits_of(pb) != bits_of(p0));
      CHECK((bits_of(bb) != bits_of(buf0)) == with_momentum);  // the buffer moves only with momentum
    }
  }
  // The guard's sums of squares: 8 chunks of 1000 elements 1003 apart, in FP32/FP16/BF16,
  // over many binades (the squares' sum must be the baseline's to the bit), and with an
  // inf in one chunk (a non-finite sum in that lane, on every path; NaN payloads aside).
  auto dbits = [](double d) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
  };
  for (const GemmElem elem : {GemmElem::F32, GemmElem::F16, GemmElem::BF16}) {
    INFO("sum_squares_8, element type " << static_cast<int>(elem));
    const int64_t stride = 1003, len = 1000;
    std::vector<float> x = element_inputs(8 * stride, 990 + static_cast<uint64_t>(elem));
    for (float& e : x)
      if (!std::isfinite(e)) e = 0.5f;
    std::vector<uint16_t> h(x.size());
    if (elem == GemmElem::F16) cvt_f32_to_f16(x.data(), h.data(), static_cast<int64_t>(x.size()));
    if (elem == GemmElem::BF16) cvt_f32_to_bf16(x.data(), h.data(), static_cast<int64_t>(x.size()));
    const void* data = elem == GemmElem::F32 ? static_cast<const void*>(x.data()) : static_cast<const void*>(h.data());
    for (const float inv : {1.0f, 1.0f / 65536.0f, 3.1e-5f}) {
      double sb[8], sw[8];
      base.sum_squares_8(data, elem, stride, len, inv, sb);
      wide.sum_squares_8(data, elem, stride, len, inv, sw);
      for (int k = 0; k < 8; ++k) CHECK(dbits(sb[k]) == dbits(sw[k]));
      CHECK(sb[3] > 0.0);
    }
    check_sums_at(base, wide, data, elem, stride, x, h);
    if (elem == GemmElem::F32) {
      x[5 * stride + 17] = INFINITY;
      double sb[8], sw[8];
      base.sum_squares_8(x.data(), elem, stride, len, 1.0f, sb);
      wide.sum_squares_8(x.data(), elem, stride, len, 1.0f, sw);
      CHECK((std::isinf(sb[5]) && std::isinf(sw[5])));
      CHECK(dbits(sb[4]) == dbits(sw[4]));
    }
  }
  // The activations on: a stride through all 2^32 bit patterns (every binade, subnormals,
  // +-inf, NaNs with payloads and both signs), the usual inputs with the specials, and the
  // values at and around the branch points of erf_exp.h (|x| / sqrt 2 = 0.875 and 4, the
  // GELU select at -8, the gradient's at 16, exp's clamp at -104 (x^2 / 2 = 104 at |x| = 14.42)
  // and the pdf's underflow to subnormals (13.34); the tanh form's selects at 20 and its
  // e^(-2|u|) underflow to 0 near 10.5).
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) x.push_back(f32_from_bits(static_cast<uint32_t>(u)));
  for (const float v : element_inputs(4099, 990)) x.push_back(v);
  for (const float b : {0.875f * 1.41421356f, 4.0f * 1.41421356f, 8.0f, 16.0f, 14.4222f, 13.34f, 1.0f, 10.5f, 20.0f})
    for (int k = -64; k <= 64; ++k) {  // b and its neighbours a few ulps apart, both signs
      x.push_back(b + static_cast<float>(k) * std::ldexp(b, -23));
      x.push_back(-x.back());
    }
  for (int k = -64; k <= 64; ++k) x.push_back(std::ldexp(static_cast<float>(k), -149));  // subnormals
  for (const float v : {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1e-45f, -1e-45f, 3.4e38f, -3.4e38f})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> dy = element_inputs(n, 991);  // NaN, inf and 0 among them
  std::vector<float> yb(x.size()), yw(x.size());
  INFO("activations, n = " << n);
  base.gelu(x.data(), yb.data(), n);
  wide.gelu(x.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  std::vector<float> inplace = x;  // y may be x
  wide.gelu(inplace.data(), inplace.data(), n);
  CHECK(bits_of(inplace) == bits_of(yb));
  base.gelu_grad(x.data(), dy.data(), yb.data(), n);
  wide.gelu_grad(x.data(), dy.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  inplace = dy;  // dx may be dy
  wide.gelu_grad(x.data(), inplace.data(), inplace.data(), n);
  CHECK(bits_of(inplace) == bits_of(yb));
  base.gelu_tanh(x.data(), yb.data(), n);
  wide.gelu_tanh(x.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  base.gelu_tanh_grad(x.data(), dy.data(), yb.data(), n);
  wide.gelu_tanh_grad(x.data(), dy.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  base.relu(x.data(), yb.data(), n);
  wide.relu(x.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  base.relu_grad(x.data(), dy.data(), yb.data(), n);
  wide.relu_grad(x.data(), dy.data(), yw.data(), n);
  CHECK(bits_of(yb) == bits_of(yw));
  // Odd lengths: the vector bodies and the scalar tails (GELU's erf block: 16 at a time on
  // AVX-512, the rest plainly; 512 per block).
  for (const int64_t m : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{529}, int64_t{1040}}) {
    base.gelu(x.data() + 5, yb.data(), m);
    wide.gelu(x.data() + 5, yw.data(), m);
    CHECK(std::memcmp(yb.data(), yw.data(), static_cast<size_t>(m) * 4) == 0);
    base.gelu_grad(x.data() + 5, dy.data(), yb.data(), m);
    wide.gelu_grad(x.data() + 5, dy.data(), yw.data(), m);
    CHECK(std::memcmp(yb.data(), yw.data(), static_cast<size_t>(m) * 4) == 0);
    base.gelu_tanh_grad(x.data() + 5, dy.data(), yb.data(), m);
    wide.gelu_tanh_grad(x.data() + 5, dy.data(), yw.data(), m);
    CHECK(std::memcmp(yb.data(), yw.data(), static_cast<size_t>(m) * 4) == 0);
    // sum_rows' column sums in double: rows of x added one after another (odd lengths: tails).
    std::vector<double> sb(static_cast<size_t>(m), 0.25), sw(sb);
    for (int64_t r = 0; r < 5; ++r) {
      base.add_row_f64(x.data() + r * 97, m, sb.data());
      wide.add_row_f64(x.data() + r * 97, m, sw.data());
    }
    CHECK(std::memcmp(sb.data(), sw.data(), static_cast<size_t>(m) * 8) == 0);
    double plain = 0.25;
    for (int64_t r = 0; r < 5; ++r) plain += static_cast<double>(x[static_cast<size_t>(r * 97 + m - 1)]);
    CHECK(sw[static_cast<size_t>(m) - 1] == plain);
  }
}

}  // namespace

TEST_CASE("cpu isa avx2: element kernels bit for bit the baseline's", "[kernels][cpu][isa]") {
  element_suite(CpuIsa::Avx2);
}
TEST_CASE("cpu isa avx512: element kernels bit for bit the baseline's", "[kernels][cpu][isa]") {
  element_suite(CpuIsa::Avx512);
}

TEST_CASE("cpu isa: the backend's activations run the element kernels, the baseline's bits on every path",
          "[kernels][cpu][isa]") {
  IsaRestore restore;
  const int64_t n = 5003;  // several 1024-element blocks and a tail
  std::vector<float> xv = element_inputs(n, 31), gv = element_inputs(n, 32);
  Rng rng(33);
  for (size_t i = 0; i < xv.size(); i += 2) xv[i] = rng.uniform(-6.0f, 6.0f);  // half in GELU's curved range
  for (const DType d : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor x = Tensor::from_vector(xv, Shape{n}).to(d), dy = Tensor::from_vector(gv, Shape{n}).to(d);
    auto run = [&](CpuIsa isa, Activation act) {
      force_cpu_isa(isa);
      Tensor y = Tensor::empty(Shape{n}, d), dx = Tensor::empty(Shape{n}, d);
      cpu_backend().activation(act, x, y);
      cpu_backend().activation_backward(act, x, dy, dx);
      return std::make_pair(bits_of(y), bits_of(dx));
    };
    for (const Activation act : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
      const auto base = run(CpuIsa::Baseline, act);
      for (const CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16}) {
        if (!cpu_isa_available(isa)) continue;
        INFO(dtype_name(d) << ", path " << cpu_isa_name(isa) << ", activation " << static_cast<int>(act));
        const auto wide = run(isa, act);
        CHECK(wide.first == base.first);
        CHECK(wide.second == base.second);
      }
      if (d == DType::F32) {  // and they are the element kernels' results
        const ElementBlocks& k = cpu_element_blocks(CpuIsa::Baseline);
        std::vector<float> y(xv.size()), dx(xv.size());
        (act == Activation::Gelu ? k.gelu : act == Activation::GeluTanh ? k.gelu_tanh : k.relu)(xv.data(), y.data(), n);
        (act == Activation::Gelu       ? k.gelu_grad
         : act == Activation::GeluTanh ? k.gelu_tanh_grad
                                       : k.relu_grad)(xv.data(), gv.data(), dx.data(), n);
        CHECK(bits_of(y) == base.first);
        CHECK(bits_of(dx) == base.second);
      }
    }
  }
}

namespace {
// Dense inputs for the accuracy checks: every 1/1024 in [-lim, lim], then random values over
// many binades (both signs, 2^-40 to 2^7, and a few subnormals).
std::vector<float> accuracy_inputs(float lim) {
  std::vector<float> x;
  for (int i = -static_cast<int>(lim * 1024); i <= static_cast<int>(lim * 1024); ++i) x.push_back(i / 1024.0f);
  Rng rng(4242);
  for (int i = 0; i < 200000; ++i) {
    const float v = rng.uniform(1.0f, 2.0f) * std::ldexp(1.0f, static_cast<int>(rng.next_u64() % 48) - 40);
    x.push_back(rng.next_u64() % 2 ? v : -v);
  }
  for (int k = 1; k < 100; ++k) x.push_back(std::ldexp(static_cast<float>(k * 997), -149));
  return x;
}

// The element kernels' paths (baseline, avx2, avx512) this CPU runs; a warning for the others.
std::vector<CpuIsa> element_paths_here() {
  std::vector<CpuIsa> paths;
  for (const CpuIsa isa : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (cpu_isa_available(isa)) paths.push_back(isa);
    else WARN("the " << cpu_isa_name(isa) << " path needs " << missing_list(isa) << ": not run here");
  }
  return paths;
}
}  // namespace

TEST_CASE("cpu erf, exp, GELU and GELU' against FP64", "[kernels][cpu][isa]") {
  const double u = test::unit_roundoff(DType::F32);  // 2^-24
  // erf (kernels/cpu/isa/erf_exp.h): an absolute bound, because GELU adds erf to 1. The
  // polynomials' own error is below 1e-9 (fitted in FP64); the rest is FP32 rounding in
  // Horner forms whose terms sum to at most ~1.5x the result (|x| < 0.875) or to a small Q
  // subtracted from 1 (the result's rounding, u at most, dominates): together at most 2.5 u
  // (1.5e-7; the offline sweep's worst was 1.13e-7 at |x| = 0.87). Beyond 4, erf is +-1
  // and the true value is within 1.5e-8 = 0.26 u of it.
  {
    std::vector<float> x = accuracy_inputs(6.0f), got(x.size());
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      got[i] = cpu_math::erf_f32(x[i]);
      want[i] = std::erf(static_cast<double>(x[i]));
    }
    INFO("erf");
    test::check_close(got, want, test::Tolerance{0.0, 2.5 * u});
    CHECK(cpu_math::erf_f32(INFINITY) == 1.0f);
    CHECK(cpu_math::erf_f32(-INFINITY) == -1.0f);
    CHECK(std::isnan(cpu_math::erf_f32(NAN)));
    CHECK(f32_bits(cpu_math::erf_f32(-0.0f)) == 0x80000000u);
  }
  // exp: 1.5 ulps relative, i.e. 3 u of the result (an ulp is at most 2 u of it). The
  // Taylor polynomial's truncation is 0.1 ulp, k ln2 is subtracted exactly (kLn2Hi has 16
  // trailing zero bits) and only k * kLn2Lo rounds (1e-7 of r's ulp), the Horner steps on
  // |r| <= 0.35 add well under an ulp, and the scale by 2^k is exact; the final product
  // rounds once more to a subnormal, so add one subnormal's worth absolutely.
  // The same bound for the form with fused multiply-adds (exp_f32_with, as the attention's
  // softmax runs it on the FMA paths; std::fma here, the same single rounding).
  struct FusedMulAdd {
    static float f(float a, float b, float c) { return std::fma(a, b, c); }
  };
  for (const bool fused : {false, true}) {
    INFO((fused ? "fused" : "plain") << " multiply-adds");
    std::vector<float> x;
    for (float v = -110.0f; v <= 90.0f; v += 1.0f / 512.0f) x.push_back(v);
    for (const float v : accuracy_inputs(1.0f)) x.push_back(v);
    std::vector<float> got(x.size());
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      got[i] = fused ? cpu_math::exp_f32_with<FusedMulAdd>(x[i]) : cpu_math::exp_f32(x[i]);
      // The FP32 result: inf where FP64 exceeds FLT_MAX (overflow), as the kernel rounds.
      const double e = std::exp(static_cast<double>(x[i]));
      want[i] = e > 3.4028234663852886e38 ? INFINITY : e;
    }
    std::vector<float> finite_got;
    std::vector<double> finite_want;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isinf(want[i])) {
        CHECK(std::isinf(got[i]));
        continue;
      }
      finite_got.push_back(got[i]);
      finite_want.push_back(want[i]);
    }
    INFO("exp");
    test::check_close(finite_got, finite_want, test::Tolerance{3.0 * u, std::ldexp(1.0, -149)});
    CHECK(cpu_math::exp_f32(-INFINITY) == 0.0f);
    CHECK(cpu_math::exp_f32(INFINITY) == INFINITY);
    CHECK(cpu_math::exp_f32(0.0f) == 1.0f);
    CHECK(std::isnan(cpu_math::exp_f32(NAN)));
  }
  // GELU and GELU' through the element kernels of every path this CPU has (their bits are
  // the baseline's, element_suite, but run them all anyway).
  const std::vector<float> x = accuracy_inputs(10.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<double> want(x.size()), mag(x.size()), dwant(x.size()), dmag(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    want[i] = v * cdf;
    dwant[i] = cdf + v * pdf;
    // GELU = 0.5 x (1 + erf(x / sqrt 2)): erf's 2.5 u (absolute) times 0.5 |x| is 1.25 u |x|;
    // the argument's two roundings (the constant and the product) move erf by at most
    // 2 u |x / sqrt 2| * erf' <= 0.6 u |x| before the 0.5 |x| factor, under 0.25 u |x|;
    // 1 + erf and the final product round once each, u |GELU| <= u |x| each: 3.5 u |x|,
    // bound 4 u |x|. Relative to |x|, not to |GELU|: for x < -4 the result is a difference
    // 1 + erf of nearly equal numbers, as in PyTorch's formula and glibc's erff. For a
    // subnormal x, 0.5 x and the product each round to the subnormal grid: one subnormal
    // absolutely (Tolerance::abs below).
    mag[i] = std::fabs(v);
    // GELU' = cdf + x pdf: computed from erf and exp, cdf carried erf's 1.25 u and two
    // roundings (<= u each, cdf <= 1); x pdf exp's 3 u, the 1/sqrt(2 pi) constant and two
    // products (3 u), and the rounding of x^2 / 2 moved exp's argument by u x^2 / 2, a relative
    // error of that size; the sum rounded once (u of at most 1 + |x| pdf). Altogether under
    // 6 u (1 + |x| pdf (1 + x^2 / 2)), the bound kept when GELU' got polynomials of its own
    // (erf_exp.h), which tools/fit_gelu_grad.py measures at 2.5 u of it.
    dmag[i] = 1.0 + std::fabs(v) * pdf * (1.0 + 0.5 * v * v);
  }
  for (const CpuIsa isa : element_paths_here()) {
    INFO("path " << cpu_isa_name(isa));
    const ElementBlocks& k = cpu_element_blocks(isa);
    std::vector<float> y(x.size()), dx(x.size());
    k.gelu(x.data(), y.data(), n);
    k.gelu_grad(x.data(), ones.data(), dx.data(), n);
    test::check_close(y, want, test::Tolerance{4.0 * u, std::ldexp(1.0, -149)}, mag);
    test::check_close(dx, dwant, test::Tolerance{6.0 * u, 0.0}, dmag);
    // The limits at the infinities (PyTorch gives NaN at both, an open bug of theirs), and
    // the exact values at 0.
    const float specials[] = {INFINITY, -INFINITY, 0.0f, -0.0f, NAN};
    float ys[5], ds[5];
    const float one5[5] = {1, 1, 1, 1, 1};
    k.gelu(specials, ys, 5);
    k.gelu_grad(specials, one5, ds, 5);
    CHECK(ys[0] == INFINITY);
    CHECK(f32_bits(ys[1]) == 0x80000000u);  // -0: GELU of every x below -5.7 is -0 too
    CHECK(f32_bits(ys[2]) == 0u);
    CHECK(f32_bits(ys[3]) == 0x80000000u);
    CHECK(std::isnan(ys[4]));
    CHECK(ds[0] == 1.0f);
    CHECK(ds[1] == 0.0f);
    CHECK(ds[2] == 0.5f);
    CHECK(ds[3] == 0.5f);
    CHECK(std::isnan(ds[4]));
  }
}

// GELU's blocks of kErfBlock = 512 values take one loop where every erf takes the short
// branch: a block of small values with one value that takes the long one (at the block's
// edges, inside it, in a second block, in the tail past the last whole vector) or one NaN must
// still take the long branch for it.
TEST_CASE("cpu GELU and GELU': one long-branch value or NaN in a block of short ones", "[kernels][cpu][isa]") {
  const double u = std::ldexp(1.0, -24);
  const int64_t n = 1037;  // two whole blocks and a tail of 13, not a whole vector
  Rng rng(512);
  std::vector<float> small(static_cast<size_t>(n));
  for (float& v : small) v = rng.uniform(-1.2f, 1.2f);  // |x / sqrt 2| < 0.875: the short branch
  for (const CpuIsa isa : element_paths_here()) {
    const ElementBlocks& k = cpu_element_blocks(isa);
    for (const int64_t at : {int64_t{0}, int64_t{300}, int64_t{511}, int64_t{512}, int64_t{1030}, int64_t{1036}})
      for (const float odd : {3.0f, -2.5f, 1.25f, NAN}) {
        INFO("path " << cpu_isa_name(isa) << ", x[" << at << "] = " << odd);
        std::vector<float> x = small, y(x.size()), dx(x.size());
        x[static_cast<size_t>(at)] = odd;
        const std::vector<float> ones(x.size(), 1.0f);
        k.gelu(x.data(), y.data(), n);
        k.gelu_grad(x.data(), ones.data(), dx.data(), n);
        // The finite values against FP64 with the bounds of the test above; the NaN passes.
        std::vector<float> got, dgot;
        std::vector<double> want, mag, dwant, dmag;
        for (size_t i = 0; i < x.size(); ++i) {
          const double v = x[i];
          if (std::isnan(v)) {
            CHECK(std::isnan(y[i]));
            CHECK(std::isnan(dx[i]));
            continue;
          }
          const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0)), pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
          got.push_back(y[i]);
          want.push_back(v * cdf);
          mag.push_back(std::fabs(v));
          dgot.push_back(dx[i]);
          dwant.push_back(cdf + v * pdf);
          dmag.push_back(1.0 + std::fabs(v) * pdf * (1.0 + 0.5 * v * v));
        }
        test::check_close(got, want, test::Tolerance{4.0 * u, std::ldexp(1.0, -149)}, mag);
        test::check_close(dgot, dwant, test::Tolerance{6.0 * u, 0.0}, dmag);
      }
  }
}

TEST_CASE("cpu GELU's tanh form and its derivative against FP64, on every path", "[kernels][cpu][isa]") {
  const double u = std::ldexp(1.0, -24);
  const std::vector<float> x = accuracy_inputs(12.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<double> want(x.size()), mag(x.size()), dwant(x.size()), dmag(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const test::GeluTanhRef r = test::gelu_tanh_reference(x[i], 3.0);  // belay's exp: 3 u
    want[i] = r.y;
    mag[i] = r.y_mag;
    dwant[i] = r.dy;
    dmag[i] = r.dy_mag;
  }
  for (const CpuIsa isa : element_paths_here()) {
    INFO("path " << cpu_isa_name(isa));
    const ElementBlocks& k = cpu_element_blocks(isa);
    std::vector<float> y(x.size()), dx(x.size());
    k.gelu_tanh(x.data(), y.data(), n);
    k.gelu_tanh_grad(x.data(), ones.data(), dx.data(), n);
    // A subnormal x: 0.5 x and the quotient round to the subnormal grid (one subnormal).
    test::check_close(y, want, test::Tolerance{u, std::ldexp(1.0, -149)}, mag);
    test::check_close(dx, dwant, test::Tolerance{u, 0.0}, dmag);
    // Known values (PyTorch's F.gelu(approximate='tanh') in FP64: gelu_tanh(1) =
    // 0.8411919906082768), the limits at the infinities and the exact values at 0.
    const float specials[] = {INFINITY, -INFINITY, 0.0f, -0.0f, NAN, 1.0f, -20.0f};
    float ys[7], ds[7];
    const float one7[7] = {1, 1, 1, 1, 1, 1, 1};
    k.gelu_tanh(specials, ys, 7);
    k.gelu_tanh_grad(specials, one7, ds, 7);
    CHECK(ys[0] == INFINITY);
    CHECK(f32_bits(ys[1]) == 0x80000000u);
    CHECK(f32_bits(ys[2]) == 0u);
    CHECK(f32_bits(ys[3]) == 0x80000000u);
    CHECK(std::isnan(ys[4]));
    CHECK(ys[5] == Approx(0.8411919906082768).epsilon(2e-7));
    CHECK(f32_bits(ys[6]) == 0x80000000u);
    CHECK(ds[0] == 1.0f);
    CHECK(ds[1] == 0.0f);
    CHECK(ds[2] == 0.5f);
    CHECK(ds[3] == 0.5f);
    CHECK(std::isnan(ds[4]));
    CHECK(ds[6] == 0.0f);
  }
}

TEST_CASE("cpu isa: the packed product's bits do not depend on the thread count", "[kernels][cpu][isa]") {
  // Each output's K products are summed in the same order whichever thread computes it
  // (threads take whole slices of C), so a resume with another OMP_NUM_THREADS repeats.
  // BF16 inputs too: on the avx512bf16 path they take the pair kernel; and the amx path's
  // tile product, on the emulator.
  const std::function<void(const GemmArgs&)> active = [](const GemmArgs& a) { cpu_gemm_on(active_cpu_isa(), a); };
  const std::pair<DType, std::function<void(const GemmArgs&)>> runs[] = {
      {DType::F32, active}, {DType::BF16, active}, {DType::BF16, cpu_gemm_amx_emulated}};
  for (const auto& run : runs) {  // not a structured binding: clang 14 cannot capture one in a lambda
    const DType in = run.first;
    const std::function<void(const GemmArgs&)>& gemm = run.second;
    INFO("inputs " << dtype_name(in) << ", path " << cpu_isa_name(active_cpu_isa())
                   << (gemm.target<void (*)(const GemmArgs&)>() ? " (amx emulated)" : ""));
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
      gemm(args);
      return bits_of(c);
    };
    const std::vector<uint32_t> one = product(1), two = product(2), three = product(3);
    omp_set_num_threads(saved);
    CHECK(one == two);
    CHECK(one == three);
  }
}
