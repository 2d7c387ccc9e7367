// The amx path's limit: TDPBF16PS on tiles that stay in the tile registers, on all OpenMP
// threads (built only for the amx copy: bench/CMakeLists.txt). Four independent C tiles
// per iteration, so the next instruction never waits on the last one's result.
//
// Check: A and B hold BF16 1.0 everywhere, so each TDPBF16PS adds 32 products of 1 to every
// element: after `iters` iterations each element is exactly 32 iters, whatever order the
// hardware adds the products in, as long as every partial sum is an integer below 2^24
// (iters <= 2^19). The sum over every element of every tile of every thread, each divided by
// 32 iters, is then the number of elements. (Products of 1/32, tried first, lose their
// increments once C passes 2^19 if the hardware adds them to C one by one.)
#if !defined(BELAY_ISA_NS) || !defined(BELAY_ISA_amx)
#error "bench/tile_peak.cpp is built for the amx copy only"
#endif
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bench/fma_peak.h"
#include "kernels/cpu/isa/amx_tiles.h"

namespace belay::bench::BELAY_ISA_NS {

PeakRun tile_peak(int64_t iters) {
  namespace amx = belay::BELAY_ISA_NS::amx;
  constexpr int kElems = 16 * 16;              // FP32 elements per C tile
  constexpr double kFlopsPerDot = 16.0 * 16 * 32 * 2;
  double total = 0.0;
  int threads = 1;
#pragma omp parallel reduction(+ : total)
  {
#pragma omp single
    threads = omp_get_num_threads();
    amx::TileConfig cfg;
    for (int t = 0; t < amx::kTiles; ++t) {
      cfg.rows[t] = amx::kMaxRows;
      cfg.colsb[t] = amx::kMaxColsb;
    }
    alignas(64) uint16_t ones[16 * 32];
    for (uint16_t& o : ones) o = 0x3f80;  // BF16 1.0
    amx::load_config(cfg);
    amx::load<4>(ones, 64);
    amx::load<6>(ones, 64);
    amx::zero<0>();
    amx::zero<1>();
    amx::zero<2>();
    amx::zero<3>();
    for (int64_t i = 0; i < iters; ++i) {
      amx::dot_bf16<0, 4, 6>();
      amx::dot_bf16<1, 4, 6>();
      amx::dot_bf16<2, 4, 6>();
      amx::dot_bf16<3, 4, 6>();
    }
    alignas(64) float c[4][kElems];
    amx::store<0>(c[0], 64);
    amx::store<1>(c[1], 64);
    amx::store<2>(c[2], 64);
    amx::store<3>(c[3], 64);
    amx::release();
    double s = 0.0;
    for (const auto& tile : c)
      for (float x : tile) s += static_cast<double>(x) / (32.0 * static_cast<double>(iters));
    total += s;
  }
  PeakRun r;
  r.flops = 4.0 * kFlopsPerDot * static_cast<double>(iters) * threads;
  r.sum = total;
  r.lanes_total = 4 * kElems * threads;
  return r;
}

}  // namespace belay::bench::BELAY_ISA_NS
