// The packed CPU GEMM's blocking as a function of the caches (kernels/cpu/gemm_blocking.h):
// the invariants for several cache hierarchies and every path's microkernel (panels fit the
// cache level they are meant for, blocks are whole panels), the values on the machines the
// GEMM was measured on (KC there is what it was before the caches were read, so those machines
// keep their bits), and that MC and NC do not change a product's bits while KC does.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/random.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_blocking.h"
#include "kernels/cpu/isa/gemm_f32.h"
#include "tests/tolerance.h"

using namespace belay;
using belay::test::bits_of;

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

// The paths' microkernels (kernels/cpu/isa/gemm_packed.cpp): MR, NR, largest KC.
const MicroTile kAvx512{12, 32, 192}, kAvx2{6, 16, 256}, kBaseline{6, 8, 256};

CpuCaches caches(int64_t l1d, int64_t l2, int64_t l3, int l3_shared_by, int l2_shared_by = 1) {
  CpuCaches c;
  c.l1d = l1d;
  c.l2 = l2;
  c.l3 = l3;
  c.l3_shared_by = l3_shared_by;
  c.l2_shared_by = l2_shared_by;
  c.source = "test";
  return c;
}

struct Hierarchy {
  const char* name;
  CpuCaches c;
};
const std::vector<Hierarchy>& hierarchies() {
  static const std::vector<Hierarchy> h = {
      {"Zen 3 (32K L1d, 512K L2, 32M L3 per 16 CPUs)", caches(32 * KiB, 512 * KiB, 32 * MiB, 16)},
      {"Zen 5 (48K, 1M, 32M per 16)", caches(48 * KiB, 1 * MiB, 32 * MiB, 16)},
      {"this Xeon (48K, 2M, 480M per 2)", caches(48 * KiB, 2 * MiB, 480 * MiB, 2)},
      {"Skylake-SP (32K, 1M, 1.375M per CPU)", caches(32 * KiB, 1 * MiB, 1408 * KiB, 1)},
      {"hyperthreads share L2 (48K, 2M per 2, 105M per 112)", caches(48 * KiB, 2 * MiB, 105 * MiB, 112, 2)},
      {"no L3 (32K, 256K)", caches(32 * KiB, 256 * KiB, 0, 1)},
      {"tiny (4K, 16K, none)", caches(4 * KiB, 16 * KiB, 0, 1)},
      {"nothing read (all zero: the defaults)", caches(0, 0, 0, 1)},
  };
  return h;
}

void check_invariants(const CpuCaches& c, const MicroTile& t) {
  const GemmBlocking b = gemm_blocking(c, t);
  INFO("L1d " << c.l1d << " L2 " << c.l2 << " L3 " << c.l3 << " / MR " << t.mr << " NR " << t.nr << " -> KC " << b.kc
              << " MC " << b.mc << " NC " << b.nc);
  const int64_t l1 = c.l1d > 0 ? c.l1d : 32 * KiB;
  const int64_t l2 = c.l2 > 0 ? c.l2 : 512 * KiB;  // whole, even when hyperthreads share it
  const int64_t l3 = c.l3 > 0 ? c.l3 / c.l3_shared_by : 0;
  CHECK(b.mr == t.mr);
  CHECK(b.nr == t.nr);
  // KC: a multiple of 16 within [16, kc_max]; one B panel in half of L1d (unless at the floor).
  CHECK(b.kc % 16 == 0);
  CHECK(b.kc >= 16);
  CHECK(b.kc <= t.kc_max);
  if (b.kc > 16) CHECK(int64_t{b.kc} * t.nr * 4 <= l1 / 2);
  // MC: whole A panels; the A block in half of L2 (unless one panel already does not fit).
  CHECK(b.mc % t.mr == 0);
  CHECK(b.mc >= t.mr);
  CHECK(b.mc <= 288);
  if (b.mc > t.mr) CHECK(int64_t{b.mc} * b.kc * 4 <= l2 / 2);
  // The order: an A panel in L1 and the B block in L2 where L2 holds 2 MiB or more.
  CHECK(b.a_in_l1 == (l2 >= 2 * MiB));
  // NC: whole B panels; the B block in half of the L3 share (L2 without an L3, or in that order).
  const int64_t b_room = b.a_in_l1 ? l2 : (l3 > 0 ? l3 : l2);
  CHECK(b.nc % t.nr == 0);
  CHECK(b.nc >= t.nr);
  CHECK(b.nc <= 4096);
  if (b.nc > t.nr) CHECK(int64_t{b.nc} * b.kc * 4 <= b_room / 2);
  // Each is the largest that fits (below its cap): one more step would not.
  if (b.kc < t.kc_max / 16 * 16) CHECK(int64_t{b.kc + 16} * t.nr * 4 > l1 / 2);
  if (b.mc < 288 / t.mr * t.mr) CHECK(int64_t{b.mc + t.mr} * b.kc * 4 > l2 / 2);
  if (b.nc < 4096 / t.nr * t.nr) CHECK(int64_t{b.nc + t.nr} * b.kc * 4 > b_room / 2);
}

}  // namespace

TEST_CASE("gemm blocking: panels fit their cache level and are whole micro-tiles, for several hierarchies",
          "[kernels][cpu][gemm][blocking]") {
  for (const Hierarchy& h : hierarchies()) {
    INFO(h.name);
    for (const MicroTile& t : {kAvx512, kAvx2, kBaseline}) check_invariants(h.c, t);
  }
}

TEST_CASE("gemm blocking: the values on the machines measured, KC as before (the same bits)",
          "[kernels][cpu][gemm][blocking]") {
  const CpuCaches zen3 = hierarchies()[0].c, zen5 = hierarchies()[1].c, xeon = hierarchies()[2].c;
  // Zen 3 (avx2): KC 256 as before; MC 252 (A block 252 KiB, half the L2: 288 measured best);
  // NC 1024 (B block 1 MiB: half of its 2 MiB share of the L3).
  GemmBlocking b = gemm_blocking(zen3, kAvx2);
  CHECK(b.kc == 256);
  CHECK(b.mc == 252);
  CHECK(b.nc == 1024);
  CHECK(gemm_blocking(zen3, kBaseline).kc == 256);
  // The same with its hyperthreads visible (L2 shared by 2): L2 counts whole, MC stays 252.
  CpuCaches zen3_smt = zen3;
  zen3_smt.l2_shared_by = 2;
  CHECK(gemm_blocking(zen3_smt, kAvx2).mc == 252);
  // Zen 5 (avx512): KC 192 as before; MC at its cap of 288 rows; NC 1344 (half of 2 MiB).
  b = gemm_blocking(zen5, kAvx512);
  CHECK(b.kc == 192);
  CHECK(b.mc == 288);
  CHECK(b.nc == 1344);
  CHECK(gemm_blocking(zen5, kAvx2).kc == 256);
  // This Xeon (avx512): KC 192 as before; MC at its cap of 288 rows; an A panel in L1 (2 MiB
  // L2) and NC 1344 (the B block, 1008 KiB, in half of L2). Zen 5 keeps the B panel in L1.
  b = gemm_blocking(xeon, kAvx512);
  CHECK(b.kc == 192);
  CHECK(b.mc == 288);
  CHECK(b.a_in_l1);
  CHECK(b.nc == 1344);
  CHECK_FALSE(gemm_blocking(zen5, kAvx512).a_in_l1);
  CHECK(gemm_blocking(xeon, kAvx2).kc == 256);
  CHECK(gemm_blocking(xeon, kBaseline).kc == 256);
  // An AVX-512 CPU with a 32 KiB L1d (Skylake-SP, Zen 4): KC 128 so a B panel (16 KiB) leaves
  // half of L1 to the A panels; that machine's bits differ from those of the fixed KC 192.
  CHECK(gemm_blocking(hierarchies()[3].c, kAvx512).kc == 128);
}

TEST_CASE("gemm blocking: each available path's blocking is gemm_blocking of the caches read",
          "[kernels][cpu][gemm][blocking]") {
  const CpuCaches& c = cpu_caches();
  INFO(cpu_caches_report());
  const std::string source = c.source;
  CHECK((source == "sysfs" || source == "cpuid" || source == "defaults"));
  if (source != "defaults") {
    CHECK(c.l1d >= 4 * KiB);
    CHECK(c.l2 >= c.l1d);
  }
  CHECK(c.cores >= 1);
  for (const CpuIsa isa : kAllCpuIsas) {
    if (!cpu_isa_available(isa)) continue;
    INFO(cpu_gemm_blocking_report(isa));
    const GemmBlocking b = cpu_gemm_blocking(isa);
    const MicroTile t = isa >= CpuIsa::Avx512 ? kAvx512 : isa == CpuIsa::Avx2 ? kAvx2 : kBaseline;
    const GemmBlocking want = gemm_blocking(c, t);
    CHECK(b.mr == want.mr);
    CHECK(b.nr == want.nr);
    CHECK(b.kc == want.kc);
    CHECK(b.mc == want.mc);
    CHECK(b.nc == want.nc);
  }
}

namespace {

using PackedFn = void (*)(const GemmF32Args&);

// C = A op(B) (+ bias) for FP32 A (m x k) and B (n x k when trans_b, else k x n), through `fn`
// with blocking `b`.
std::vector<float> product(PackedFn fn, const GemmBlocking& b, bool trans_b, int64_t m, int64_t n, int64_t k,
                           const std::vector<float>& a, const std::vector<float>& w, const std::vector<float>& bias,
                           GemmTile tile = GemmTile::Auto) {
  std::vector<float> c(static_cast<size_t>(m * n));
  GemmF32Args g;
  g.a = a.data();
  g.a_rows = m;
  g.a_cols = k;
  g.b = w.data();
  g.b_rows = trans_b ? n : k;
  g.b_cols = trans_b ? k : n;
  g.trans_b = trans_b;
  g.c = c.data();
  g.bias = bias.data();
  g.blocking = b;
  g.tile = tile;
  fn(g);
  return c;
}

// Inputs past every block and tile edge: M = 301 (several MC blocks of 12 or 36; 25 x 12 + 1 and
// 37 x 8 + 5 rows), N = 333 (10 x 32 + 13 and 6 x 48 + 45 columns), K = 1000 (KC blocks and a
// short last one), uniform in [-1, 1].
struct EdgeCase {
  int64_t m = 301, n = 333, k = 1000;
  std::vector<float> a, w, bias;
  explicit EdgeCase(uint64_t seed) : a(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)), bias(static_cast<size_t>(n)) {
    Rng rng(seed);
    for (float& x : a) x = rng.uniform(-1.0f, 1.0f);
    for (float& x : w) x = rng.uniform(-1.0f, 1.0f);
    for (float& x : bias) x = rng.uniform(-1.0f, 1.0f);
  }
  std::vector<float> run(PackedFn fn, const GemmBlocking& b, bool trans_b, GemmTile tile = GemmTile::Auto) const {
    return product(fn, b, trans_b, m, n, k, a, w, bias, tile);
  }
};

struct PackedPath {
  CpuIsa isa;
  PackedFn fn;
};
const PackedPath kPackedPaths[] = {{CpuIsa::Baseline, isa_baseline::gemm_packed},
                                   {CpuIsa::Avx2, isa_avx2::gemm_packed},
                                   {CpuIsa::Avx512, isa_avx512::gemm_packed},
                                   {CpuIsa::Avx512Bf16, isa_avx512bf16::gemm_packed}};

}  // namespace

TEST_CASE("gemm blocking: MC, NC and the loop order leave a product's bits alone, KC sets them", "[kernels][cpu][gemm][blocking]") {
  const EdgeCase e(2026);
  for (const PackedPath& p : kPackedPaths)
    for (const bool tb : {true, false}) {
      if (!cpu_isa_available(p.isa)) continue;
      INFO("path " << cpu_isa_name(p.isa) << (tb ? ", B transposed" : ", B as stored"));
      const GemmBlocking own = cpu_gemm_blocking(p.isa);
      const std::vector<uint32_t> ref = bits_of(e.run(p.fn, own, tb));
      // The smallest blocks, odd multiples, and the blocking of another machine with the same KC.
      for (const auto& [mc, nc] : {std::pair<int, int>{own.mr, own.nr},
                                   {3 * own.mr, 5 * own.nr},
                                   {own.mc, own.nr},
                                   {own.mr, 4096 / own.nr * own.nr}}) {
        for (const bool a_in_l1 : {false, true}) {  // and either order of the inner loops
          GemmBlocking b = own;
          b.mc = mc;
          b.nc = nc;
          b.a_in_l1 = a_in_l1;
          INFO("MC " << mc << " NC " << nc << (a_in_l1 ? ", an A panel in L1" : ", a B panel in L1"));
          CHECK(bits_of(e.run(p.fn, b, tb)) == ref);
        }
      }
      // Another KC sums in other blocks: some bits differ (all equal would mean KC was ignored).
      GemmBlocking other = own;
      other.kc = own.kc / 2;
      const std::vector<uint32_t> got = bits_of(e.run(p.fn, other, tb));
      int differing = 0;
      for (size_t i = 0; i < got.size(); ++i) differing += got[i] != ref[i];
      INFO(differing << " of " << got.size() << " differ with KC " << other.kc);
      CHECK(differing > 0);
    }
}

TEST_CASE("gemm blocking: a blocking refitted to another micro-tile keeps KC, whole panels otherwise",
          "[kernels][cpu][gemm][blocking]") {
  for (const Hierarchy& h : hierarchies()) {
    INFO(h.name);
    const GemmBlocking own = gemm_blocking(h.c, kAvx512);
    const GemmBlocking wide = gemm_blocking_for_tile(own, 8, 48);
    CHECK(wide.mr == 8);
    CHECK(wide.nr == 48);
    CHECK(wide.kc == own.kc);
    CHECK(wide.mc % 8 == 0);
    CHECK(wide.nc % 48 == 0);
    CHECK(wide.mc >= 8);
    CHECK(wide.nc >= 48);
    CHECK(wide.mc <= own.mc);
    CHECK(wide.nc <= own.nc);
  }
  // This Xeon's: MC 288 is already whole 8-row panels; NC 1344 is 28 panels of 48; the order kept.
  const GemmBlocking xeon = gemm_blocking_for_tile(gemm_blocking(hierarchies()[2].c, kAvx512), 8, 48);
  CHECK(xeon.mc == 288);
  CHECK(xeon.nc == 1344);
  CHECK(xeon.a_in_l1);
  // Zen 5's NC 1344 too; the 4096 of a large L3 share becomes 85 panels of 48.
  CpuCaches big_l3 = hierarchies()[1].c;
  big_l3.l3 = 480 * MiB;
  big_l3.l3_shared_by = 2;
  CHECK(gemm_blocking_for_tile(gemm_blocking(big_l3, kAvx512), 8, 48).nc == 4080);
  // Blocks smaller than one new panel become one panel.
  const GemmBlocking tiny = gemm_blocking_for_tile(GemmBlocking{12, 32, 16, 12, 32}, 8, 48);
  CHECK(tiny.mc == 8);
  CHECK(tiny.nc == 48);
}

TEST_CASE("gemm blocking: the wide tile where N fills its panels", "[kernels][cpu][gemm][blocking]") {
  // GPT-2 small's N and Linear(4096): at most 2% of the columns computed for nothing.
  for (const int64_t n : {48, 768, 2048, 2304, 3072, 4096, 50257, 50304}) {
    INFO("N " << n);
    CHECK(gemm_prefers_wide_tile(n, 48));
  }
  // The default GPT's N and others the last panel of 48 fills badly.
  for (const int64_t n : {1, 32, 128, 256, 384 + 16, 512, 1024}) {
    INFO("N " << n);
    CHECK_FALSE(gemm_prefers_wide_tile(n, 48));
  }
  CHECK_FALSE(gemm_prefers_wide_tile(0, 48));
}

TEST_CASE("gemm blocking: the narrow and the wide micro-tile give the same bits", "[kernels][cpu][gemm][blocking]") {
  const EdgeCase e(7);  // past every edge of both tiles, with the bias
  for (const PackedPath& p : kPackedPaths)
    for (const bool tb : {true, false}) {
      if (!cpu_isa_available(p.isa)) continue;
      INFO("path " << cpu_isa_name(p.isa) << (tb ? ", B transposed" : ", B as stored"));
      const GemmBlocking own = cpu_gemm_blocking(p.isa);
      const std::vector<float> narrow = e.run(p.fn, own, tb, GemmTile::Narrow);
      CHECK(bits_of(e.run(p.fn, own, tb, GemmTile::Wide)) == bits_of(narrow));
      const int64_t m = e.m, n = e.n, k = e.k;
      const std::vector<float>& a = e.a, &w = e.w, &bias = e.bias;
      // And against the FP64 product (every 37th row): the tiles computed it, so equal bits
      // cannot come from two tiles that skipped the same work.
      std::vector<float> got;
      std::vector<double> want, magnitude;
      for (int64_t i = 0; i < m; i += 37)
        for (int64_t j = 0; j < n; ++j) {
          double ref = bias[static_cast<size_t>(j)], mag = std::fabs(ref);
          for (int64_t q = 0; q < k; ++q) {
            const double t = static_cast<double>(a[static_cast<size_t>(i * k + q)]) *
                             (tb ? w[static_cast<size_t>(j * k + q)] : w[static_cast<size_t>(q * n + j)]);
            ref += t;
            mag += std::fabs(t);
          }
          got.push_back(narrow[static_cast<size_t>(i * n + j)]);
          want.push_back(ref);
          magnitude.push_back(mag);
        }
      belay::test::check_close(got, want, belay::test::tolerance_for(DType::F32, DType::F32, k + 1), magnitude);
    }
}
