// Matrix products on the CPU through belay's packed product (kernels/cpu/isa/gemm_packed.cpp),
// built once per vector ISA and chosen at run time (kernels/cpu/cpu_isa.h). Low-precision
// inputs are widened to FP32 exactly while packing, multiplied and summed in FP32 and rounded
// once on output: the numerics of a tensor core. Moves (M*K + K*N + M*N) elements, does
// 2*M*N*K flops.
#pragma once
#include <string>

#include "engine/backend.h"
#include "kernels/cpu/gemm_blocking.h"
#include "kernels/cpu/cpu_isa.h"

namespace belay {

void cpu_gemm(const GemmArgs& args);                // on the active path
void cpu_gemm_on(CpuIsa isa, const GemmArgs& args); // on the given path (tests, bench); Error if unavailable
// The amx path's BF16 x BF16 product (kernels/cpu/isa/gemm_amx.cpp) run on the emulator of
// the tile instructions (kernels/cpu/isa/amx_tiles.h), on any x86-64 CPU: for tests. Error
// for other dtypes. The emulator counts what hardware would fault on (a bad tile shape or
// configuration); the tests require none after a product.
void cpu_gemm_amx_emulated(const GemmArgs& args);
int amx_emulator_faults();
std::string amx_emulator_first_fault();
void amx_emulator_reset_faults();
struct GemmF32Args;
enum class GemmElem : int;
// The GemmElem of an FP32/FP16/BF16 tensor's dtype; Error for any other dtype.
GemmElem gemm_elem_of(DType dtype);
// The path's FP32 Eigen product on raw pointers, no checks or widening: what belay's wrapper
// adds is measured against it (bench/gemm.cpp). Error if the path cannot run here.
void cpu_gemm_f32_direct(CpuIsa isa, const GemmF32Args& args);
// The path's packed product on raw pointers (any GemmElem inputs), no checks. Runs with the
// path's blocking (cpu_gemm_blocking), whatever args.blocking says.
void cpu_gemm_packed_direct(CpuIsa isa, const GemmF32Args& args);
// The blocking of the path's packed product (kernels/cpu/gemm_blocking.h): from the caches read
// at start (computed once per path), or the compiled-in one under BELAY_GEMM_BLOCKING=fixed.
// The amx path's is avx512bf16's (its FP32 and FP16 products run that code).
GemmBlocking cpu_gemm_blocking(CpuIsa isa);
// Whether the path's packed product has the wide micro-tile (kGemmWideMr x kGemmWideNr): the AVX-512 paths.
bool cpu_gemm_has_wide_tile(CpuIsa isa);
std::string cpu_caches_report();                  // "L1d 48 KiB 12-way, L2 2 MiB 16-way, ..."
std::string cpu_gemm_blocking_report(CpuIsa isa);  // "avx512: MR 12 NR 32 KC 192 MC 288 NC 1344, an A panel in L1 ..."

}  // namespace belay
