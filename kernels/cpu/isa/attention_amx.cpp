// The fused attention's BF16 products on AMX tiles (attention_bf16.h), built for the amx copy
// and the tile emulator's (isa.cmake). The products are amx_blocks.h's 32 x 32 microkernel, the
// GEMM's own: each output sums its k pairs in order (even product, then odd, amx_tiles.h), from
// C's old value. The packing and the roundings of P and dS to BF16 are attention_pairs.h's,
// shared with the VDPBF16PS copy (attention_vdpbf16.cpp).
#if !defined(BELAY_ISA_NS)
#error "kernels/cpu/isa/attention_amx.cpp is built once per copy by isa.cmake"
#endif
#define BELAY_HD static inline  // engine/half_bits.h: this copy's own rounding (the one-definition rule)
#include <stdint.h>

#include "kernels/cpu/isa/amx_blocks.h"
#include "kernels/cpu/isa/attention_pairs.h"

namespace belay::BELAY_ISA_NS {
namespace {

static_assert(kBf16Block == kTileK, "the attention's depth steps are the microkernel's");

void begin() {
  const amx::TileConfig cfg = tile_config();
  amx::load_config(cfg);
}
void end() { amx::release(); }

void product(int64_t m, int64_t n, int64_t depth, const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ps,
             float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; i += kBlock)
    for (int64_t j = 0; j < n; j += kBlock)
      microkernel(static_cast<int>(depth), a + i * lda, lda, b + j / kBlock * ps, c + i * ldc + j, ldc, !accumulate);
}

}  // namespace

extern const AttentionBf16 attention_amx = attention_pairs::table(begin, end, product);

}  // namespace belay::BELAY_ISA_NS
