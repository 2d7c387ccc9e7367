// Matrix products on the CPU through Eigen, built once per vector ISA (kernels/cpu/isa/)
// and chosen at run time (kernels/cpu/cpu_isa.h). Low-precision inputs are widened to FP32
// exactly, multiplied and summed in FP32 and rounded once on output: the numerics of a
// tensor core. Moves (M*K + K*N + M*N) elements, does 2*M*N*K flops.
#pragma once
#include "engine/backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace belay {

void cpu_gemm(const GemmArgs& args);                // on the active path
void cpu_gemm_on(CpuIsa isa, const GemmArgs& args); // on the given path (tests, bench); Error if unavailable

}  // namespace belay
