// The AMX tile operations the amx GEMM (kernels/cpu/isa/gemm_amx.cpp) uses, in one of two
// builds of the same source:
//   - real: the instructions (LDTILECFG, TILEZERO, TILELOADD, TILESTORED, TDPBF16PS,
//     TILERELEASE), in the copy built with -mamx-tile -mamx-bf16;
//   - emulated (BELAY_AMX_EMULATED): each instruction as the Intel SDM describes it, on
//     eight 1 KB tiles per thread in memory, in a copy built for baseline x86-64. The GEMM's
//     own code (tile shapes, strides, the VNNI packing, the edges) then runs on every CPU
//     in every CI run, the way kernels/cuda runs under the SIMT emulator: no machine here
//     has had AMX yet.
// The emulator also checks what the hardware would fault on (#GP, #UD): a configuration
// with rows > 16, colsb > 64, a reserved byte set or a half-configured tile; a tile used
// while unconfigured; TDPBF16PS on shapes that do not chain (C rows != A rows, A pairs !=
// B rows, C colsb != B colsb) or on a repeated tile. A fault is counted and the first one's
// message kept (faults(), first_fault()); the operation is then skipped, as a real fault
// would stop it. tests/kernels/test_amx_emulator.cpp plants each fault and checks the count.
//
// Rounding, emulated (SDM, TDPBF16PS): for each element of C, for each pair k in order,
// C += a_even * b_even, then C += a_odd * b_odd; each product is exact (8-bit significands),
// each sum rounded to nearest even; BF16 inputs below 2^-126 read as zero and a subnormal
// result is flushed to zero, whatever MXCSR says. (The SDM's newer text sums even and odd
// products apart before adding them to C; real hardware may differ from this order in the
// last bits, which is why every test holds the amx path to the tolerance helper, not bits.)
//
// Included only by files built once per ISA: everything is in BELAY_ISA_NS.
#pragma once
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/amx_tiles.h belongs to a per-ISA copy (BELAY_ISA_NS)"
#endif
#include <stdint.h>
#include <string.h>

namespace belay::BELAY_ISA_NS::amx {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

// LDTILECFG's 64-byte operand, palette 1 (8 tiles of at most 16 rows x 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;     // where an interrupted TILELOADD resumes: 0 to start
  uint8_t reserved[14] = {};  // must be zero
  uint16_t colsb[16] = {};    // bytes per row, per tile
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

#if !defined(BELAY_AMX_EMULATED)

// GCC's _tile_* intrinsics paste the tile number into the instruction text, so they take
// only literal numbers; these templates write the same instructions with the number as an
// immediate operand (%c: printed bare). "memory": the loads read what plain stores wrote,
// and the stores write what plain loads read next.
inline void load_config(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" : : "m"(c)); }
inline void release() { __asm__ volatile("tilerelease" ::: "memory"); }
template <int T>
inline void zero() {
  __asm__ volatile("tilezero %%tmm%c0" : : "i"(T));
}
template <int T>
inline void load(const void* base, int64_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void store(void* base, int64_t stride) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride), "i"(T) : "memory");
}
template <int C, int A, int B>  // AT&T order: B, A, C
inline void dot_bf16() {
  static_assert(C != A && C != B && A != B, "TDPBF16PS takes three different tiles (#UD)");
  __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B));
}

#else  // BELAY_AMX_EMULATED

struct State {
  TileConfig cfg;
  bool configured = false;
  alignas(64) uint8_t tile[kTiles][kMaxRows * kMaxColsb];
};
inline thread_local State tls_state;

// Faults of every thread: a count, and the first message (the GEMM runs on OpenMP threads).
inline int g_faults = 0;
inline int g_fault_claimed = 0;
inline char g_first_fault[160] = {};

inline void fault(const char* what) {
  __atomic_add_fetch(&g_faults, 1, __ATOMIC_RELAXED);
  int expected = 0;
  if (__atomic_compare_exchange_n(&g_fault_claimed, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    size_t n = strlen(what);
    if (n >= sizeof g_first_fault) n = sizeof g_first_fault - 1;
    memcpy(g_first_fault, what, n);
    g_first_fault[n] = '\0';
  }
}
inline int faults() { return __atomic_load_n(&g_faults, __ATOMIC_RELAXED); }
inline const char* first_fault() { return g_first_fault; }
inline void reset_faults() {
  __atomic_store_n(&g_faults, 0, __ATOMIC_RELAXED);
  g_first_fault[0] = '\0';
  __atomic_store_n(&g_fault_claimed, 0, __ATOMIC_RELEASE);
}

inline void load_config(const TileConfig& c) {
  State& s = tls_state;
  if (c.palette == 0) {  // palette 0: the same as TILERELEASE
    s.configured = false;
    return;
  }
  if (c.palette != 1) return fault("ldtilecfg: palette other than 0 or 1 (#GP)");
  if (c.start_row != 0) return fault("ldtilecfg: start_row not 0 (belay never interrupts a load)");
  for (uint8_t r : c.reserved)
    if (r != 0) return fault("ldtilecfg: a reserved byte is set (#GP)");
  for (int t = 0; t < 16; ++t) {
    const bool beyond = t >= kTiles;
    if (beyond && (c.rows[t] != 0 || c.colsb[t] != 0)) return fault("ldtilecfg: tile 8-15 configured (#GP)");
    if (c.rows[t] > kMaxRows || c.colsb[t] > kMaxColsb) return fault("ldtilecfg: rows > 16 or colsb > 64 (#GP)");
    if ((c.rows[t] == 0) != (c.colsb[t] == 0)) return fault("ldtilecfg: a tile with rows or colsb alone (#GP)");
  }
  s.cfg = c;
  s.configured = true;
  memset(s.tile, 0, sizeof s.tile);  // LDTILECFG zeroes the tile data
}

inline void release() { tls_state.configured = false; }

// True when tile t is usable; otherwise a fault (#UD on hardware).
inline bool usable(int t, const char* what) {
  const State& s = tls_state;
  if (!s.configured || t < 0 || t >= kTiles || s.cfg.rows[t] == 0) {
    fault(what);
    return false;
  }
  return true;
}

template <int T>
inline void zero() {
  if (usable(T, "tilezero: tile not configured (#UD)")) memset(tls_state.tile[T], 0, sizeof tls_state.tile[T]);
}

// Row r of the tile: colsb bytes from base + r * stride; the bytes past colsb and the rows
// past `rows` are zero (the SDM's zeroing of the upper part).
template <int T>
inline void load(const void* base, int64_t stride) {
  if (!usable(T, "tileloadd: tile not configured (#UD)")) return;
  State& s = tls_state;
  const int rows = s.cfg.rows[T], colsb = s.cfg.colsb[T];
  memset(s.tile[T], 0, sizeof s.tile[T]);
  for (int r = 0; r < rows; ++r)
    memcpy(s.tile[T] + r * kMaxColsb, static_cast<const uint8_t*>(base) + r * stride, static_cast<size_t>(colsb));
}

template <int T>
inline void store(void* base, int64_t stride) {
  if (!usable(T, "tilestored: tile not configured (#UD)")) return;
  const State& s = tls_state;
  const int rows = s.cfg.rows[T], colsb = s.cfg.colsb[T];
  for (int r = 0; r < rows; ++r)
    memcpy(static_cast<uint8_t*>(base) + r * stride, s.tile[T] + r * kMaxColsb, static_cast<size_t>(colsb));
}

// BF16 -> FP32 as TDPBF16PS reads it: the top half of an FP32, a subnormal read as zero.
inline float bf16_in(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;  // DAZ
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
inline float flush(float f) {  // FTZ: a subnormal result becomes a zero of its sign
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  memcpy(&f, &bits, 4);
  return f;
}

template <int C, int A, int B>
inline void dot_bf16() {
  static_assert(C != A && C != B && A != B, "TDPBF16PS takes three different tiles (#UD)");
  if (!usable(C, "tdpbf16ps: C not configured (#UD)") || !usable(A, "tdpbf16ps: A not configured (#UD)") ||
      !usable(B, "tdpbf16ps: B not configured (#UD)"))
    return;
  State& s = tls_state;
  const TileConfig& g = s.cfg;
  if (g.colsb[C] % 4 || g.colsb[A] % 4 || g.colsb[B] % 4) return fault("tdpbf16ps: colsb not a multiple of 4 (#UD)");
  if (g.rows[C] != g.rows[A]) return fault("tdpbf16ps: C and A have different rows (#UD)");
  if (g.colsb[A] / 4 != g.rows[B]) return fault("tdpbf16ps: A's pairs per row != B's rows (#UD)");
  if (g.colsb[C] != g.colsb[B]) return fault("tdpbf16ps: C and B have different colsb (#UD)");
  const int m_rows = g.rows[C], pairs = g.colsb[A] / 4, n_cols = g.colsb[C] / 4;
  for (int m = 0; m < m_rows; ++m) {  // the tiles are bytes: elements are copied in and out
    float c[kMaxColsb / 4];
    uint16_t a[kMaxColsb / 2], b[kMaxColsb / 2];
    memcpy(c, s.tile[C] + m * kMaxColsb, sizeof c);
    memcpy(a, s.tile[A] + m * kMaxColsb, sizeof a);
    for (int k = 0; k < pairs; ++k) {
      memcpy(b, s.tile[B] + k * kMaxColsb, sizeof b);
      const float a0 = bf16_in(a[2 * k]), a1 = bf16_in(a[2 * k + 1]);
      for (int n = 0; n < n_cols; ++n) {
        c[n] = flush(c[n] + a0 * bf16_in(b[2 * n]));  // exact product, one rounding
        c[n] = flush(c[n] + a1 * bf16_in(b[2 * n + 1]));
      }
    }
    memcpy(s.tile[C] + m * kMaxColsb, c, sizeof c);
  }
}

#endif  // BELAY_AMX_EMULATED

}  // namespace belay::BELAY_ISA_NS::amx
