#include "kernels/cpu/cpu_convert.h"

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay {

const ElementBlocks& cpu_element_blocks(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return isa_avx2::element_blocks;
    case CpuIsa::Avx512:
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Amx: return isa_avx512::element_blocks;  // no element kernel uses VDPBF16PS or tiles
    case CpuIsa::Baseline: break;
  }
  return isa_baseline::element_blocks;
}

const ElementBlocks& cpu_element_blocks() { return cpu_element_blocks(active_cpu_isa()); }

void cvt_f32_to_f16(const float* src, uint16_t* dst, int64_t n) { cpu_element_blocks().f32_to_f16(src, dst, n); }
void cvt_f16_to_f32(const uint16_t* src, float* dst, int64_t n) { cpu_element_blocks().f16_to_f32(src, dst, n); }
void cvt_f32_to_bf16(const float* src, uint16_t* dst, int64_t n) { cpu_element_blocks().f32_to_bf16(src, dst, n); }
void cvt_bf16_to_f32(const uint16_t* src, float* dst, int64_t n) { cpu_element_blocks().bf16_to_f32(src, dst, n); }

}  // namespace belay
