// The blocking of the packed CPU GEMM (kernels/cpu/isa/gemm_packed.cpp) as a function of the
// caches found at run time: index math in a small testable function, as
// kernels/cuda/gemm_layout.h is for the CUDA GEMM (tests/kernels/test_gemm_blocking.cpp).
//
// The loops (Goto & van de Geijn; BLIS), per thread slice of C:
//   for jc (NC columns of op(B)), for pc (KC rows of op(B)): pack op(B)'s KC x NC block
//     for ic (MC rows of op(A)): pack op(A)'s MC x KC block
//       for jr (NR-wide panels of the packed B), for ir (MR-tall panels of the packed A):
//         the MR x NR microkernel down KC
// What each level keeps in which cache:
//   - one packed B panel, KC x NR floats, in L1 (reused by the MC/MR microkernel calls of a jr);
//   - the packed A block, MC x KC, in L2 (streamed through L1 once per B panel);
//   - the packed B block, KC x NC, in the thread's share of L3 (or of L2 without one).
// Where L2 holds 2 MiB or more (`a_in_l1`), the two inner loops swap: for ir, for jr. One
// packed A panel (MR x KC: 6 KiB for avx512's 8 x 48 tile at KC 192) stays in L1 while the B
// panels stream from L2, which now holds the B block (NC: the block in half of L2) beside the A
// block. The B panel of the other order (36 KiB for the 8 x 48 tile) filled most of a 48 KiB
// L1d. Measured on the AMX Xeon (2 MiB L2; 1 thread, CPU time, the two orders alternately in
// one process, the same bits, four runs: bench/results/cpu-2026-12-06-xeon-gemm-order.md):
// GPT-2 small's products at 1024 tokens took 0.88-1.045 of the time, about 0.97 on average,
// with NC 1344; NC 768 and 1536 did about the same, NC 2304 up to 1.27 (a B block of 1.8 MiB:
// no longer in L2 beside the A block). Not measured
// on CPUs with less L2 (Zen 3-5: 0.5-1 MiB), which keep the order above; nor taken where a
// thread's slice of C is narrower than NC / 2 (gemm_packed.cpp, gemm_slice).
//
// Bits: the sum of each output depends on KC only (its K products summed in FP32 one KC block
// at a time, k ascending inside a block, each block's sum added to C), not on MC, NC, the
// loop order or the thread count. So MC and NC follow the caches freely; KC is the L1 rule
// capped at the path's `kc_max` (its measured value). So the bits of an FP32 product follow the
// L1d: avx512 takes 192 with a 48 KiB L1d (the Xeon) and 128 with 32 KiB (Zen 4, whose products
// therefore round otherwise), avx2 and baseline 256 with 32 or 48 KiB. A longer KC where the A
// panel sits in L1 (fewer passes over C) measured no faster on the AMX Xeon (2026-12-06, avx512,
// GPT-2 small's products alternated as above): KC 384 with NC 672 took 0.98-1.07x KC 192's time,
// KC 768 with NC 336 0.94-1.07x.
//
// Plain types and declarations only: the per-ISA copies include this header, and an inline
// function here would be one weak symbol shared by every copy (docs/toolchain.md).
#pragma once
#include <stdint.h>

namespace belay {

// The data caches one core sees, in bytes (0: none or unknown), and how many cores share each.
struct CpuCaches {
  int64_t line = 64;
  int64_t l1d = 0, l2 = 0, l3 = 0;
  int l1d_ways = 0, l2_ways = 0;
  int l2_shared_by = 1, l3_shared_by = 1;  // logical CPUs per instance
  int cores = 1;                           // online logical CPUs
  const char* source = "none";             // "sysfs", "cpuid", or "defaults"
};

// A path's microkernel: MR rows x NR columns of C in registers; kc_max: the largest KC the path
// allows (its buffers' depth; the measured best, which also fixes the bits).
struct MicroTile {
  int mr = 1, nr = 1, kc_max = 1;
};

struct GemmBlocking {
  int mr = 0, nr = 0;
  int kc = 0;   // k per block (a multiple of 16, <= kc_max): the summation order
  int mc = 0;   // rows of op(A) per block: a multiple of mr
  int nc = 0;   // columns of op(B) per block: a multiple of nr
  bool a_in_l1 = false;  // the inner loops' order (above): an A panel in L1, the B block in L2
};

// The blocking for the caches `c` and the microkernel `t` (pure: no I/O):
//   KC: one B panel in half of L1d (KC x NR x 4 <= L1d / 2), a multiple of 16, in [16, kc_max];
//   MC: the A block in half of L2 (MC x KC x 4 <= L2 / 2), a multiple of MR, in
//       [MR, 288]: the other half holds the B panels and C lines streaming through; 288 rows
//       (the measured best on Zen 3) is also the most, as more measured no better on this
//       Xeon (gemm_blocking.cpp);
//   NC: the B block in half of the thread's L3 share (L2 without an L3), a multiple of NR, in
//       [NR, 4096] (4096: the widest measured; wider only grows the buffer);
//   a_in_l1 where L2 is 2 MiB or more, and then NC puts the B block in half of L2 instead.
// Missing sizes fall back to 32 KiB L1d, 512 KiB L2, no L3. The L3 counts as its size over the
// logical CPUs sharing it; L1d and L2 count whole, even where hyperthreads share them.
GemmBlocking gemm_blocking(const CpuCaches& c, const MicroTile& t);

// `b` (made for one micro-tile of a path) for another tile of the same path, mr x nr: KC kept
// (it sets the bits), MC and NC rounded down to whole panels of the new tile (at least one).
GemmBlocking gemm_blocking_for_tile(const GemmBlocking& b, int mr, int nr);

// Whether a product N columns wide takes a path's wide tile (nr_wide columns a panel, the
// AVX-512 paths' 8 x 48) over its own: when the wide tile's last panel leaves at most 2% of N
// computed for nothing (N = 768, 2048, 2304, 3072, 4096, 50257: yes; 128, 512, 1024: no), as
// measured (kernels/cpu/isa/gemm_packed.cpp, TileShape).
bool gemm_prefers_wide_tile(int64_t n, int nr_wide);

// The caches of CPU 0: sysfs (/sys/devices/system/cpu/cpu0/cache/index*/), else cpuid (leaf 4
// on Intel, 0x8000001D on AMD), else the defaults above. Read once (the first call).
const CpuCaches& cpu_caches();

}  // namespace belay
