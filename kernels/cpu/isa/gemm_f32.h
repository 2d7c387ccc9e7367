// The FP32 product C (+)= op(A) op(B) (+ bias), once per vector ISA. gemm_f32.cpp is
// compiled once per path with exactly that path's flags (kernels/cpu/isa/isa.cmake), with
// Eigen's namespace renamed and its own code in a namespace per path, so no template or
// inline function is shared between the copies (the linker would keep one copy for all:
// docs/toolchain.md). This header holds only plain types and declarations.
// Moves (M*K + K*N + M*N) floats (+ M*N more read when accumulating), does 2*M*N*K flops.
#pragma once
#include <cstdint>

#include "kernels/cpu/gemm_blocking.h"

namespace belay {

// The element type of an input as stored. The packed product widens FP16/BF16 to FP32 while
// packing (exact); the Eigen product takes FP32 only.
enum class GemmElem : int { F32 = 0, F16 = 1, BF16 = 2 };

// Which micro-tile the packed product runs (gemm_packed.cpp): Auto, chosen by N
// (gemm_prefers_wide_tile); Narrow, the path's own; Wide, the AVX-512 paths' 8 x 48 (Narrow
// where the path has none). The same bits on every one: the bench and tests name them.
enum class GemmTile : int { Auto = 0, Narrow = 1, Wide = 2 };
constexpr int kGemmWideMr = 8, kGemmWideNr = 48;  // the AVX-512 paths' wide tile

struct GemmF32Args {
  const void* a = nullptr;  // row-major, a_rows x a_cols as stored (before op)
  GemmElem a_type = GemmElem::F32;
  int64_t a_rows = 0, a_cols = 0;
  bool trans_a = false;
  const void* b = nullptr;  // row-major, b_rows x b_cols as stored
  GemmElem b_type = GemmElem::F32;
  int64_t b_rows = 0, b_cols = 0;
  bool trans_b = false;
  float* c = nullptr;        // row-major M x N
  // BF16 C instead of `c` (then null): each output rounded once (engine/half_bits.h) after the
  // bias, as a cast of the FP32 C would. Only gemm_amx takes it, with K in one block
  // (kAmxOneBlockK) and accumulate false.
  uint16_t* c_bf16 = nullptr;
  bool accumulate = false;   // C += product; else C = product
  const float* bias = nullptr;  // [N] added to every row, or null
  // The packed product's blocking (kernels/cpu/gemm_blocking.h; cpu_gemm.cpp fills it from the
  // caches read at start); kc = 0: the path's compiled-in defaults. The Eigen product ignores it.
  GemmBlocking blocking;
  GemmTile tile = GemmTile::Auto;  // the packed product's micro-tile; the others ignore it
};

// Eigen's product (FP32 inputs only): the comparison the bench measures the packed one against.
namespace isa_baseline { void gemm_f32(const GemmF32Args& args); }
namespace isa_avx2 { void gemm_f32(const GemmF32Args& args); }
namespace isa_avx512 { void gemm_f32(const GemmF32Args& args); }

// belay's own packed product (gemm_packed.cpp): any GemmElem inputs, FP32 accumulation.
namespace isa_baseline { void gemm_packed(const GemmF32Args& args); }
namespace isa_avx2 { void gemm_packed(const GemmF32Args& args); }
namespace isa_avx512 { void gemm_packed(const GemmF32Args& args); }
// avx512 plus VDPBF16PS for BF16 x BF16 (other inputs: the avx512 FP32 panels).
namespace isa_avx512bf16 { void gemm_packed(const GemmF32Args& args); }
// The path's microkernel (MR x NR, largest KC) and the blocking it uses when given none.
namespace isa_baseline { MicroTile gemm_micro_tile(); GemmBlocking gemm_default_blocking(); }
namespace isa_avx2 { MicroTile gemm_micro_tile(); GemmBlocking gemm_default_blocking(); }
namespace isa_avx512 { MicroTile gemm_micro_tile(); GemmBlocking gemm_default_blocking(); }
namespace isa_avx512bf16 { MicroTile gemm_micro_tile(); GemmBlocking gemm_default_blocking(); }
// BF16 x BF16 only, on AMX tiles (gemm_amx.cpp): the real instructions, and the same source
// on kernels/cpu/isa/amx_tiles.h's emulator (any x86-64 CPU; tests).
namespace isa_amx { void gemm_amx(const GemmF32Args& args); }
// K up to this is one K block on the tiles (gemm_amx.cpp): each C block is final when its tiles
// are stored, so gemm_amx can round it to BF16 there (c_bf16) when nothing accumulates into C
// and K is at least 1 (kernels/cpu/cpu_gemm.cpp decides).
constexpr int64_t kAmxOneBlockK = 1024;
namespace isa_amx_emulated {
void gemm_amx(const GemmF32Args& args);
int amx_faults();                // what the emulator caught since the last reset (amx_tiles.h)
const char* amx_first_fault();
void amx_reset_faults();
}  // namespace isa_amx_emulated

}  // namespace belay
