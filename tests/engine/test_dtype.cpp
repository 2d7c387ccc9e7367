// The 16-bit formats, checked exhaustively: every FP16 and BF16 bit pattern decodes to the
// value its fields say, survives the round trip through FP32, and every tie between two
// neighbours rounds to the even one. An independent rounding (double arithmetic, a different
// algorithm from engine/half_bits.h) is compared over a stride through all 2^32 FP32 patterns.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>

#include "engine/dtype.h"
#include "engine/error.h"

using namespace belay;

namespace {

bool is_nan_f16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }
bool is_inf_f16(uint16_t h) { return (h & 0x7fffu) == 0x7c00u; }
bool is_inf_bf16(uint16_t h) { return (h & 0x7fffu) == 0x7f80u; }

// What a pattern means, read straight from its fields (IEEE 754 binary16 and bfloat16).
double f16_value(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -24);
  return sign * std::ldexp(1.0 + mant / 1024.0, exp - 15);
}
double bf16_value(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  if (exp == 0xff) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -133);
  return sign * std::ldexp(1.0 + mant / 128.0, exp - 127);
}

// Independent reference rounding: scale |x| by the ulp of its binade (clamped to the
// format's subnormal range), round the quotient with nearbyint (round half to even in the
// default mode), scale back and call anything that reached 2^(emax+1) infinity. All steps
// are exact in double for an FP32 input.
double round_ref(float x, int mant_bits, int emin, int emax) {
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(ax)) return x;
  double r = 0.0;
  if (ax != 0.0) {
    int e2;
    std::frexp(ax, &e2);  // ax = m * 2^e2, m in [0.5, 1): binade exponent is e2 - 1
    const int e = std::max(e2 - 1, emin);
    const double ulp = std::ldexp(1.0, e - mant_bits);
    r = std::nearbyint(ax / ulp) * ulp;
    if (r >= std::ldexp(1.0, emax + 1)) r = INFINITY;
  }
  return std::signbit(x) ? -r : r;
}
double f16_ref(float x) { return round_ref(x, 10, -14, 15); }
double bf16_ref(float x) { return round_ref(x, 7, -126, 127); }

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

}  // namespace

TEST_CASE("every fp16 pattern decodes to the value its fields say", "[engine][dtype][exhaustive]") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = f16_value(static_cast<uint16_t>(h));
    const float got = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (!same_value(got, want)) {
      if (++bad < 5) FAIL_CHECK("fp16 " << hex(h) << " decodes to " << got << ", fields say " << want);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("every bf16 pattern decodes to the value its fields say", "[engine][dtype][exhaustive]") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const double want = bf16_value(static_cast<uint16_t>(h));
    const float got = bf16_bits_to_f32(static_cast<uint16_t>(h));
    if (!same_value(got, want)) {
      if (++bad < 5) FAIL_CHECK("bf16 " << hex(h) << " decodes to " << got << ", fields say " << want);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("fp16 -> fp32 -> fp16 is the identity for all 65536 patterns, NaN stays NaN", "[engine][dtype][exhaustive]") {
  int bad = 0, nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_f16_bits(f16_bits_to_f32(static_cast<uint16_t>(h)));
    bool ok;
    if (is_nan_f16(static_cast<uint16_t>(h))) {
      ++nans;
      ok = is_nan_f16(back) && (back & 0x8000u) == (h & 0x8000u);
    } else {
      ok = back == h;
    }
    if (!ok && ++bad < 5) FAIL_CHECK("fp16 " << hex(h) << " came back as " << hex(back));
  }
  CHECK(bad == 0);
  CHECK(nans == 2 * 1023);  // the loop really met every NaN pattern
}

TEST_CASE("bf16 -> fp32 -> bf16 is the identity for all 65536 patterns, NaN stays NaN", "[engine][dtype][exhaustive]") {
  int bad = 0, nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_bf16_bits(bf16_bits_to_f32(static_cast<uint16_t>(h)));
    bool ok;
    if (is_nan_bf16(static_cast<uint16_t>(h))) {
      ++nans;
      ok = is_nan_bf16(back) && (back & 0x8000u) == (h & 0x8000u);
    } else {
      ok = back == h;
    }
    if (!ok && ++bad < 5) FAIL_CHECK("bf16 " << hex(h) << " came back as " << hex(back));
  }
  CHECK(bad == 0);
  CHECK(nans == 2 * 127);
}

// For each pair of adjacent finite values lo < hi (both signs): the exact midpoint goes to
// the one with an even mantissa, the FP32 neighbours of the midpoint go down / up.
template <class ToBits, class FromBits>
void check_ties(const char* name, uint16_t last_finite, ToBits to_bits, FromBits from_bits) {
  int bad = 0, ties = 0;
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint32_t lo = 0; lo < last_finite; ++lo) {
      const uint16_t l = static_cast<uint16_t>(lo | sign), h = static_cast<uint16_t>((lo + 1) | sign);
      const double mid_d = 0.5 * (static_cast<double>(from_bits(l)) + static_cast<double>(from_bits(h)));
      const float mid = static_cast<float>(mid_d);
      REQUIRE(static_cast<double>(mid) == mid_d);  // the midpoint is an FP32 value
      const uint16_t even = (lo & 1u) ? h : l;
      const float below = std::nextafter(mid, 0.0f);  // toward lo (smaller magnitude)
      const float above = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      const uint16_t got_mid = to_bits(mid), got_below = to_bits(below), got_above = to_bits(above);
      ++ties;
      if ((got_mid != even || got_below != l || got_above != h) && ++bad < 5)
        FAIL_CHECK(name << " between " << hex(l) << " and " << hex(h) << ": midpoint -> " << hex(got_mid)
                        << " (want " << hex(even) << "), below -> " << hex(got_below) << ", above -> "
                        << hex(got_above));
    }
  }
  CHECK(bad == 0);
  CHECK(ties == 2 * last_finite);
}

TEST_CASE("fp16 rounds every tie to even and every near-tie to nearest", "[engine][dtype][exhaustive]") {
  check_ties("fp16", 0x7bff, f32_to_f16_bits, f16_bits_to_f32);
}

TEST_CASE("bf16 rounds every tie to even and every near-tie to nearest", "[engine][dtype][exhaustive]") {
  check_ties("bf16", 0x7f7f, f32_to_bf16_bits, bf16_bits_to_f32);
}

TEST_CASE("fp16 overflow, infinities and subnormals", "[engine][dtype]") {
  // 65504 = (2 - 2^-10) * 2^15 is the largest half; its ulp is 32, so 65520 is the midpoint
  // to 65536 (not representable): the tie goes to the even side, 65536, which is inf.
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65519.99f) == 0x7bff);
  CHECK(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);
  CHECK(f32_to_f16_bits(-65520.0f) == 0xfc00);
  CHECK(f32_to_f16_bits(1e10f) == 0x7c00);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(f32_to_f16_bits(-std::numeric_limits<float>::max()) == 0xfc00);
  CHECK(f32_to_f16_bits(INFINITY) == 0x7c00);
  CHECK(f32_to_f16_bits(-INFINITY) == 0xfc00);
  CHECK(f32_to_bf16_bits(INFINITY) == 0x7f80);
  CHECK(f32_to_bf16_bits(-INFINITY) == 0xff80);
  // BF16: FLT_MAX is past the midpoint between bf16 max (2^128 - 2^120) and 2^128.
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(f32_to_bf16_bits(f32_from_bits(0x7f7f7fffu)) == 0x7f7f);
  CHECK(f32_to_bf16_bits(f32_from_bits(0x7f7f8000u)) == 0x7f80);  // tie, 0x7f7f is odd: up, to inf

  const float tiny = std::ldexp(1.0f, -24);  // the smallest fp16 subnormal
  CHECK(f32_to_f16_bits(tiny) == 0x0001);
  CHECK(f16_bits_to_f32(0x0001) == tiny);
  CHECK(f32_to_f16_bits(0.5f * tiny) == 0x0000);           // tie with 0: 0 is even
  CHECK(f32_to_f16_bits(-0.5f * tiny) == 0x8000);          // and the sign of zero is kept
  CHECK(f32_to_f16_bits(std::nextafter(0.5f * tiny, 1.0f)) == 0x0001);
  CHECK(f32_to_f16_bits(0.75f * tiny) == 0x0001);
  CHECK(f32_to_f16_bits(1.5f * tiny) == 0x0002);           // tie between 1 and 2: 2
  CHECK(f32_to_f16_bits(2.5f * tiny) == 0x0002);           // tie between 2 and 3: 2
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(f32_to_f16_bits(std::ldexp(1023.5f, -24)) == 0x0400);  // tie between the largest subnormal and it
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(f32_to_f16_bits(f32_from_bits(0x00000001u)) == 0x0000);  // an fp32 subnormal
  // -0 and +0 stay distinct.
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(std::signbit(f16_bits_to_f32(0x8000)));
}

TEST_CASE("NaN inputs of every kind stay NaN with their sign", "[engine][dtype]") {
  // Payloads that would carry into the exponent (all low bits set) must not become inf.
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x7f80ffffu, 0x7f800fffu, 0xffc00000u, 0xff800001u}) {
    const float x = f32_from_bits(u);
    const uint16_t h = f32_to_f16_bits(x), b = f32_to_bf16_bits(x);
    INFO("fp32 NaN " << hex(u) << " -> fp16 " << hex(h) << ", bf16 " << hex(b));
    CHECK(is_nan_f16(h));
    CHECK(is_nan_bf16(b));
    CHECK(((h & 0x8000u) != 0) == ((u & 0x80000000u) != 0));
    CHECK(((b & 0x8000u) != 0) == ((u & 0x80000000u) != 0));
    CHECK(std::isnan(round_to(DType::F16, x)));
    CHECK(std::isnan(round_to(DType::BF16, x)));
  }
}

TEST_CASE("a table of known roundings, derived by hand", "[engine][dtype]") {
  struct Row {
    float x;
    uint16_t f16, bf16;
    const char* why;
  };
  const Row rows[] = {
      // 1.001 = 1 + 1.024 fp16 ulps (2^-10) -> 1 ulp up; = 1 + 0.128 bf16 ulps (2^-7) -> 1.0.
      {1.001f, 0x3c01, 0x3f80, "1.001"},
      // 70000 > 65520: fp16 inf. bf16 ulp at 2^16 is 2^9 = 512; 70000/512 = 136.72 -> 137 * 512
      // = 70144 = 2^16 * (1 + 9/128): exponent 143 = 0x8f, mantissa 9 -> 0x8f << 7 | 9 = 0x4789.
      {70000.0f, 0x7c00, 0x4789, "70000"},
      // 1e-6 / 2^-24 = 16.78 -> 17 subnormal ulps = 0x0011. bf16: fp32 1e-6 is 0x358637bd, the
      // dropped half 0x37bd is below 0x8000 -> 0x3586 (= 2^-20 * 134/128).
      {1e-6f, 0x0011, 0x3586, "1e-6"},
      // 0.1 = 2^-4 * 1.6: 0.6 * 1024 = 614.4 -> 614 = 0x266, exponent 11 -> 0x2c00 | 0x266.
      // bf16: fp32 0.1 is 0x3dcccccd, dropped half 0xcccd > 0x8000 -> 0x3dcd.
      {0.1f, 0x2e66, 0x3dcd, "0.1"},
      // 1/3 = 2^-2 * 4/3: 1024/3 = 341.3 -> 341 = 0x155, exponent 13 -> 0x3555. bf16: fp32 is
      // 0x3eaaaaab, 0xaaab > 0x8000 -> 0x3eab.
      {1.0f / 3.0f, 0x3555, 0x3eab, "1/3"},
      {-2.0f, 0xc000, 0xc000, "-2"},
      {65504.0f, 0x7bff, 0x4780, "65504 (bf16: 65504 = 2^15 * 1.99902, 255.875/128 of 2^15 -> 2^16)"},
      // 65505 lies 1/32 ulp above 65504.
      {65505.0f, 0x7bff, 0x4780, "65505"},
      // Ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (fp16): even is 1.0. 1 + 2^-8 is the
      // bf16 tie between 0x3f80 (even) and 0x3f81; fp16 represents it exactly (0x3c04).
      {1.00048828125f, 0x3c00, 0x3f80, "1 + 2^-11"},
      {1.00146484375f, 0x3c02, 0x3f80, "1 + 3 * 2^-11"},
      {1.00390625f, 0x3c04, 0x3f80, "1 + 2^-8"},
      {1.01171875f, 0x3c0c, 0x3f82, "1 + 3 * 2^-8"},
      // 2049: fp16 ulp at 2048 is 2, tie -> 2048 (0x6800, even). 2051 -> 2052 (0x6802).
      {2049.0f, 0x6800, 0x4500, "2049"},
      {2051.0f, 0x6802, 0x4500, "2051"},
  };
  for (const Row& r : rows) {
    INFO(r.why << ": fp16 " << hex(f32_to_f16_bits(r.x)) << ", bf16 " << hex(f32_to_bf16_bits(r.x)));
    CHECK(f32_to_f16_bits(r.x) == r.f16);
    CHECK(f32_to_bf16_bits(r.x) == r.bf16);
  }
  // The rounded values, as finfo's users see them.
  CHECK(round_to(DType::F16, 1.001f) == 1.0009765625f);
  CHECK(round_to(DType::BF16, 70000.0f) == 70144.0f);
  CHECK(std::isinf(round_to(DType::F16, 70000.0f)));
  CHECK(round_to(DType::F16, 1e-6f) == std::ldexp(17.0f, -24));
  CHECK(round_to(DType::F32, 1.001f) == 1.001f);
}

TEST_CASE("finfo of the three dtypes", "[engine][dtype]") {
  const FInfo f32 = finfo(DType::F32), f16 = finfo(DType::F16), bf16 = finfo(DType::BF16);
  CHECK(f32.bits == 32);
  CHECK(static_cast<double>(f32.max) == std::ldexp(static_cast<double>((1 << 24) - 1), 104));  // (2 - 2^-23) 2^127
  CHECK(f32.smallest_normal == std::ldexp(1.0f, -126));
  CHECK(static_cast<double>(f32.smallest_subnormal) == std::ldexp(1.0, -149));
  CHECK(f32.eps == std::ldexp(1.0f, -23));
  CHECK(f32.max == std::numeric_limits<float>::max());
  CHECK(f32.eps == std::numeric_limits<float>::epsilon());

  CHECK(f16.bits == 16);
  CHECK(f16.max == 65504.0f);
  CHECK(f16.smallest_normal == 6.103515625e-05f);      // 2^-14
  CHECK(f16.smallest_subnormal == 5.9604644775390625e-08f);  // 2^-24
  CHECK(f16.eps == 0.0009765625f);                     // 2^-10

  CHECK(bf16.bits == 16);
  CHECK(static_cast<double>(bf16.max) == std::ldexp(255.0, 120));  // (2 - 2^-7) 2^127
  CHECK(bf16.smallest_normal == std::ldexp(1.0f, -126));
  CHECK(static_cast<double>(bf16.smallest_subnormal) == std::ldexp(1.0, -133));
  CHECK(bf16.eps == 0.0078125f);  // 2^-7

  // Each limit is itself a value of its dtype, and one step past max overflows.
  for (DType d : {DType::F16, DType::BF16}) {
    const FInfo fi = finfo(d);
    CHECK(round_to(d, fi.max) == fi.max);
    CHECK(round_to(d, fi.smallest_subnormal) == fi.smallest_subnormal);
    CHECK(round_to(d, 1.0f + fi.eps) == 1.0f + fi.eps);
    CHECK(round_to(d, 1.0f + 0.5f * fi.eps) == 1.0f);  // the tie below goes to even
    CHECK(std::isinf(round_to(d, fi.max * (1.0f + fi.eps))));
  }
  CHECK(dtype_size(DType::F32) == 4);
  CHECK(dtype_size(DType::F16) == 2);
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(std::string(dtype_name(DType::BF16)) == "bf16");
}

TEST_CASE("parse_dtype accepts the spellings and rejects the rest with a UsageError", "[engine][dtype]") {
  CHECK(parse_dtype("fp32") == DType::F32);
  CHECK(parse_dtype("FP16") == DType::F16);
  CHECK(parse_dtype("half") == DType::F16);
  CHECK(parse_dtype("bfloat16") == DType::BF16);
  CHECK_THROWS_AS(parse_dtype("fp8"), UsageError);
  CHECK_THROWS_WITH(parse_dtype("int8"), Catch::Contains("unknown dtype 'int8'"));
  CHECK_THROWS_AS(parse_dtype(""), UsageError);
}

TEST_CASE("fp32 -> fp16/bf16 agrees with an independent double-arithmetic rounding", "[engine][dtype][reference]") {
  // A stride through all 2^32 patterns (odd and prime, so every bit position varies), about
  // 4.3 million inputs of every class: zeros, subnormals, normals, overflow, inf, NaN.
  constexpr uint64_t kStride = 997;
  int bad16 = 0, bad_bf = 0;
  uint64_t checked = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += kStride) {
    const float x = f32_from_bits(static_cast<uint32_t>(u));
    const uint16_t h = f32_to_f16_bits(x), b = f32_to_bf16_bits(x);
    ++checked;
    if (std::isnan(x)) {
      if (!is_nan_f16(h) && ++bad16 < 5) FAIL_CHECK("NaN " << hex(u) << " -> fp16 " << hex(h));
      if (!is_nan_bf16(b) && ++bad_bf < 5) FAIL_CHECK("NaN " << hex(u) << " -> bf16 " << hex(b));
      continue;
    }
    const double want16 = f16_ref(x), want_bf = bf16_ref(x);
    if (!same_value(f16_value(h), want16) && ++bad16 < 5)
      FAIL_CHECK("fp16 of " << hex(u) << " (" << x << "): got " << f16_value(h) << ", reference " << want16);
    if (!same_value(bf16_value(b), want_bf) && ++bad_bf < 5)
      FAIL_CHECK("bf16 of " << hex(u) << " (" << x << "): got " << bf16_value(b) << ", reference " << want_bf);
  }
  CHECK(bad16 == 0);
  CHECK(bad_bf == 0);
  CHECK(checked > 4000000);
  // The reference itself, on points derived by hand, so a wrong reference cannot agree with a
  // wrong implementation.
  CHECK(f16_ref(65520.0f) == INFINITY);
  CHECK(f16_ref(65519.99f) == 65504.0);
  CHECK(f16_ref(1.001f) == 1.0009765625);
  CHECK(bf16_ref(70000.0f) == 70144.0);
  CHECK(f16_ref(std::ldexp(1.0f, -25)) == 0.0);
  CHECK(f16_ref(std::ldexp(0.75f, -24)) == std::ldexp(1.0, -24));
}
