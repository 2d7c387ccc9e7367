// The warp-wide matrix instructions of the tensor-core GEMM as plain functions of the 32
// lanes' registers: ldmatrix.x4 (.trans) and mma.sync.m16n8k16 with FP32 accumulators. The
// fragment layouts are gemm_layout.h's (taken from the PTX ISA's tables), the same that the
// kernel's index math is written against: the emulator's twins (simt.cpp) and the
// whole-block CPU check (tests/kernels/test_cuda_gemm_emulation.cpp) both call these.
#pragma once
#include <cstdint>

#include "engine/half_bits.h"
#include "kernels/cuda/gemm_layout.h"

namespace belay::emu {

// Run for every ldmatrix and mma of an emulated GEMM: kept out of the sanitizers' reach
// (their operands are local arrays; the shared-memory reads are checked before the call).
#define BELAY_EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined")))

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: rows[8 j + r] points at the 8 16-bit
// values of row r of matrix j (the address lane 8 j + r gave); out[lane][j] receives the
// two halves of matrix j that the lane holds.
BELAY_EMU_UNCHECKED inline void ldmatrix_x4_fragments(const uint16_t* const (&rows)[32], bool trans, uint32_t (&out)[32][4]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      uint32_t reg = 0;
      for (int h = 0; h < 2; ++h) {
        const gemm::Coord e = gemm::ldmatrix_element(lane, h, trans);
        reg |= static_cast<uint32_t>(rows[8 * j + e.row][e.col]) << (16 * h);
      }
      out[lane][j] = reg;
    }
}

BELAY_EMU_UNCHECKED inline float fragment_half(uint32_t reg, int h, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(reg >> (16 * h));
  return bf16 ? bf16_bits_to_f32(bits) : f16_bits_to_f32(bits);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: D = A B + C for one warp, C and D the
// same registers. Each product of two 16-bit values is exact in double and so is the sum of
// sixteen of them for the operands a test uses; the result is rounded to FP32 once. (The
// hardware's internal accumulation order and precision are not specified by the PTX ISA:
// tests compare through the tolerance helper, or with small integers, exact either way.)
BELAY_EMU_UNCHECKED inline void mma_m16n8k16_fragments(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], bool bf16,
                                   float (&d)[32][4]) {
  float am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        const gemm::Coord e = gemm::mma_a_element(lane, r, h);
        am[e.row][e.col] = fragment_half(a[lane][r], h, bf16);
      }
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) {
        const gemm::Coord e = gemm::mma_b_element(lane, r, h);  // (k, n)
        bm[e.row][e.col] = fragment_half(b[lane][r], h, bf16);
      }
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r) {
      const gemm::Coord e = gemm::mma_c_element(lane, r);
      double s = d[lane][r];
      for (int k = 0; k < 16; ++k) s += static_cast<double>(am[e.row][k]) * bm[k][e.col];
      d[lane][r] = static_cast<float>(s);
    }
}

}  // namespace belay::emu
