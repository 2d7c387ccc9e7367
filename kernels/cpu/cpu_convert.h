// Block conversions between FP32 and the 16-bit formats for the CPU kernels: the same bits
// as engine/half_bits.h (round to nearest even, subnormals kept, NaN stays NaN), but a
// block at a time so the loops vectorize. They run on the active CPU ISA path
// (kernels/cpu/isa/element_blocks.cpp): F16C on avx2/avx512, whose results equal the integer
// conversions of half_bits.h bit for bit on every input (bench/README.md says how that was
// checked), the integer conversions on baseline. Moves 6 bytes per element; no flops.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace belay {

struct ElementBlocks;
const ElementBlocks& cpu_element_blocks(CpuIsa isa);  // the element loops of one path
const ElementBlocks& cpu_element_blocks();            // ... of the active path

void cvt_f32_to_f16(const float* src, uint16_t* dst, int64_t n);
void cvt_f16_to_f32(const uint16_t* src, float* dst, int64_t n);
void cvt_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void cvt_bf16_to_f32(const uint16_t* src, float* dst, int64_t n);

}  // namespace belay
