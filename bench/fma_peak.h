// The machine's floating-point limit per ISA path: a register-resident multiply-add loop,
// built once per path with exactly that path's flags (bench/CMakeLists.txt, through
// kernels/cpu/isa/isa.cmake), run on all OpenMP threads. Plain declarations only.
#pragma once
#include <cstdint>

namespace belay::bench {

// Runs `iters` iterations of x = x * m + a on every accumulator of every thread (one FMA
// per lane on avx2/avx512; a multiply and an add on baseline, which has no FMA) and
// returns the flops done (2 per lane per iteration). *sum: the sum of every lane of every
// accumulator at the end (m = 0.75, a = 0.25, x0 = 1 keeps every lane exactly 1).
struct PeakRun {
  double flops = 0.0;
  double sum = 0.0;
  int lanes_total = 0;  // accumulators x lanes x threads: what sum should equal
};
namespace isa_baseline { PeakRun fma_peak(int64_t iters, float m, float a, float x0); }
namespace isa_avx2 { PeakRun fma_peak(int64_t iters, float m, float a, float x0); }
namespace isa_avx512 { PeakRun fma_peak(int64_t iters, float m, float a, float x0); }
// VDPBF16PS instead (4 flops per lane: two products, two sums); m is unused, every lane
// adds -a and then a, so it ends at exactly x0 (bench/fma_peak.cpp).
namespace isa_avx512bf16 { PeakRun fma_peak(int64_t iters, float m, float a, float x0); }
// TDPBF16PS on four register-resident C tiles (bench/tile_peak.cpp): 16384 flops per
// instruction; every element ends at exactly 32 iters (iters <= 2^19), sum counts elements.
namespace isa_amx { PeakRun tile_peak(int64_t iters); }

}  // namespace belay::bench
