// The emulator of the AMX tile instructions (kernels/cpu/isa/amx_tiles.h) on its own: what
// each instruction computes, and that it catches what the hardware would fault on. The
// amx GEMM's tests (test_cpu_isa.cpp) rely on both: a wrong tile shape in gemm_amx.cpp must
// show up here as a fault, not as a silently different product.
#define BELAY_ISA_NS amx_emulator_test
#define BELAY_AMX_EMULATED 1
#include "kernels/cpu/isa/amx_tiles.h"
#include "kernels/cpu/isa/amx_blocks.h"  // the microkernel and the GEMM's tile order for A

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/half_bits.h"
#include "engine/random.h"

namespace amx = belay::amx_emulator_test::amx;
namespace blocks = belay::amx_emulator_test;

namespace {

// The test's values are BF16 already, so taking FP32's top half is exact.
uint16_t bf16_of(float f) { return static_cast<uint16_t>(belay::f32_bits(f) >> 16); }

// rows x colsb for tiles 0..7 (0: unconfigured).
amx::TileConfig config(std::initializer_list<std::pair<int, int>> shapes) {
  amx::TileConfig c;
  int t = 0;
  for (const auto& [rows, colsb] : shapes) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = static_cast<uint16_t>(colsb);
    ++t;
  }
  return c;
}

// Expects exactly one new fault whose message contains `what`.
void expect_fault(const char* what) {
  INFO("first fault: " << amx::first_fault());
  CHECK(amx::faults() == 1);
  CHECK_THAT(std::string(amx::first_fault()), Catch::Contains(what));
  amx::reset_faults();
}

}  // namespace

TEST_CASE("amx emulator: TDPBF16PS on chained shapes against a plain reference, with strides", "[kernels][amx]") {
  amx::reset_faults();
  // C 5 x 3 FP32 (colsb 12), A 5 rows x 4 pairs (colsb 16), B 4 pairs x 3 columns (colsb 12).
  amx::load_config(config({{5, 12}, {5, 16}, {4, 12}}));
  belay::Rng rng(5);
  // A and B in memory with strides wider than a row, C starting from nonzero values.
  std::vector<uint16_t> a(5 * 20, 0xffff), b(4 * 10, 0xffff);
  std::vector<float> c(5 * 7, -1.0f);
  for (int m = 0; m < 5; ++m)
    for (int k = 0; k < 8; ++k) a[m * 20 + k] = bf16_of(static_cast<float>(static_cast<int>(rng.next_u64() % 17) - 8));
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 6; ++j) b[p * 10 + j] = bf16_of(static_cast<float>(static_cast<int>(rng.next_u64() % 9) - 4) / 8);
  for (int m = 0; m < 5; ++m)
    for (int n = 0; n < 3; ++n) c[m * 7 + n] = static_cast<float>(m - n);
  const std::vector<float> c0 = c;
  amx::load<0>(c.data(), 7 * 4);
  amx::load<1>(a.data(), 20 * 2);
  amx::load<2>(b.data(), 10 * 2);
  amx::dot_bf16<0, 1, 2>();
  std::vector<float> out(5 * 7, 99.0f);
  amx::store<0>(out.data(), 7 * 4);
  CHECK(amx::faults() == 0);
  for (int m = 0; m < 5; ++m) {
    for (int n = 0; n < 3; ++n) {
      double want = c0[m * 7 + n];  // small integers and eighths: every sum is exact
      for (int p = 0; p < 4; ++p)
        for (int h = 0; h < 2; ++h) want += belay::bf16_bits_to_f32(a[m * 20 + 2 * p + h]) * static_cast<double>(belay::bf16_bits_to_f32(b[p * 10 + 2 * n + h]));
      CHECK(out[m * 7 + n] == want);
    }
    for (int n = 3; n < 7; ++n) CHECK(out[m * 7 + n] == 99.0f);  // past colsb: untouched
  }
  amx::release();
}

TEST_CASE("amx emulator: subnormal BF16 inputs read as zero, subnormal sums flush", "[kernels][amx]") {
  amx::reset_faults();
  amx::load_config(config({{1, 4}, {1, 4}, {1, 4}}));
  // One pair: (2^-130, 1) . (2^100, 0): the subnormal reads as 0, so 0 (it would be 2^-30).
  const uint16_t a[2] = {bf16_of(std::ldexp(1.0f, -130)), bf16_of(1.0f)};
  const uint16_t b[2] = {bf16_of(std::ldexp(1.0f, 100)), 0};
  float c = 0.0f;
  amx::zero<0>();
  amx::load<1>(a, 4);
  amx::load<2>(b, 4);
  amx::dot_bf16<0, 1, 2>();
  amx::store<0>(&c, 4);
  CHECK(c == 0.0f);
  // (2^-70, 0) . (2^-60, 0) = 2^-130: a subnormal result, flushed.
  const uint16_t a2[2] = {bf16_of(std::ldexp(1.0f, -70)), 0}, b2[2] = {bf16_of(std::ldexp(1.0f, -60)), 0};
  amx::load<1>(a2, 4);
  amx::load<2>(b2, 4);
  amx::dot_bf16<0, 1, 2>();
  amx::store<0>(&c, 4);
  CHECK(c == 0.0f);
  CHECK(amx::faults() == 0);
  amx::release();
}

TEST_CASE("amx emulator: faults where the hardware would (planted mistakes)", "[kernels][amx]") {
  amx::reset_faults();
  alignas(64) uint8_t mem[16 * 64] = {};
  // Configuration faults (#GP): too many rows or bytes, half a tile, a reserved byte, tile 8+.
  amx::load_config(config({{17, 64}}));
  expect_fault("rows > 16 or colsb > 64");
  amx::load_config(config({{16, 68}}));
  expect_fault("rows > 16 or colsb > 64");
  amx::load_config(config({{4, 0}}));
  expect_fault("rows or colsb alone");
  amx::TileConfig bad = config({{1, 4}});
  bad.reserved[3] = 1;
  amx::load_config(bad);
  expect_fault("reserved byte");
  bad = config({{1, 4}});
  bad.rows[9] = 1;
  bad.colsb[9] = 4;
  amx::load_config(bad);
  expect_fault("tile 8-15");
  // Using tiles with no configuration, or one not configured (#UD).
  amx::release();
  amx::load<0>(mem, 64);
  expect_fault("tileloadd: tile not configured");
  amx::load_config(config({{16, 64}, {16, 64}}));
  amx::store<2>(mem, 64);
  expect_fault("tilestored: tile not configured");
  amx::zero<5>();
  expect_fault("tilezero: tile not configured");
  // TDPBF16PS on shapes that do not chain (#UD), each a mistake a GEMM could make.
  amx::load_config(config({{16, 64}, {8, 64}, {16, 64}}));  // C has 16 rows, A 8
  amx::dot_bf16<0, 1, 2>();
  expect_fault("C and A have different rows");
  amx::load_config(config({{16, 64}, {16, 32}, {16, 64}}));  // A: 8 pairs, B: 16 rows
  amx::dot_bf16<0, 1, 2>();
  expect_fault("A's pairs per row != B's rows");
  amx::load_config(config({{16, 32}, {16, 64}, {16, 64}}));  // C: 8 columns, B: 16
  amx::dot_bf16<0, 1, 2>();
  expect_fault("C and B have different colsb");
  amx::load_config(config({{16, 62}, {16, 64}, {16, 62}}));
  amx::dot_bf16<0, 1, 2>();
  expect_fault("colsb not a multiple of 4");
  // A fault skips the instruction: C keeps its value.
  amx::load_config(config({{1, 4}, {2, 4}, {1, 4}}));
  const float before = 3.0f;
  amx::load<0>(&before, 4);
  const uint16_t one_pair[4] = {bf16_of(1.0f), bf16_of(1.0f), bf16_of(1.0f), bf16_of(1.0f)};
  amx::load<1>(one_pair, 4);
  amx::load<2>(one_pair, 4);
  amx::dot_bf16<0, 1, 2>();
  expect_fault("C and A have different rows");
  float after = 0.0f;
  amx::store<0>(&after, 4);
  CHECK(after == 3.0f);
  CHECK(amx::faults() == 0);
  amx::release();
}

TEST_CASE("amx GEMM's tile order for A: a bijection, each tile one 1 KiB run, the same product as rows",
          "[kernels][amx]") {
  using blocks::kBlock;
  using blocks::kTileK;
  using blocks::tiled_a_index;
  // Every (row, k) of a block of 3 x 32 rows lands once in [0, rows x depth).
  for (const int depth : {32, 64, 768}) {
    const int rows = 3 * kBlock;
    std::vector<int> hits(static_cast<size_t>(rows) * depth, 0);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < depth; ++k) {
        const int64_t at = tiled_a_index(r, k, depth);
        REQUIRE(at >= 0);
        REQUIRE(at < static_cast<int64_t>(hits.size()));
        ++hits[static_cast<size_t>(at)];
      }
    for (int h : hits) REQUIRE(h == 1);
    // A tile (16 rows x 32 k from a row that is a multiple of 16, k a multiple of 32) is one
    // run: row i of it 32 values after row i - 1, as TiledA's 64-byte stride reads it.
    for (int r0 = 0; r0 < rows; r0 += 16)
      for (int k0 = 0; k0 < depth; k0 += kTileK)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < kTileK; ++j)
            REQUIRE(tiled_a_index(r0 + i, k0 + j, depth) == tiled_a_index(r0, k0, depth) + i * kTileK + j);
  }
  // The microkernel on a block packed in tile order gives the bits it gives on the same rows as
  // stored (RowsA), on the emulated tiles.
  const int depth = 96;
  belay::Rng rng(7);
  std::vector<uint16_t> rows_a(static_cast<size_t>(kBlock) * depth), tiled(rows_a.size());
  for (auto& v : rows_a) v = bf16_of(rng.uniform(-1.0f, 1.0f));
  for (int r = 0; r < kBlock; ++r)
    for (int k = 0; k < depth; ++k)
      tiled[static_cast<size_t>(tiled_a_index(r, k, depth))] = rows_a[static_cast<size_t>(r) * depth + k];
  std::vector<uint32_t> b(static_cast<size_t>(depth / 2) * kBlock);
  for (auto& w : b)
    w = bf16_of(rng.uniform(-1.0f, 1.0f)) | static_cast<uint32_t>(bf16_of(rng.uniform(-1.0f, 1.0f))) << 16;
  std::vector<float> c_rows(kBlock * kBlock, 0.0f), c_tiled(kBlock * kBlock, 0.0f);
  amx::load_config(blocks::tile_config());
  blocks::microkernel(depth, rows_a.data(), depth, b.data(), c_rows.data(), kBlock, true);
  blocks::microkernel_on(depth, blocks::TiledA{tiled.data()}, b.data(), c_tiled.data(), kBlock, true);
  amx::release();
  CHECK(amx::faults() == 0);
  bool nonzero = false;
  for (size_t i = 0; i < c_rows.size(); ++i) {
    REQUIRE(belay::f32_bits(c_tiled[i]) == belay::f32_bits(c_rows[i]));
    nonzero = nonzero || c_rows[i] != 0.0f;
  }
  CHECK(nonzero);
}
