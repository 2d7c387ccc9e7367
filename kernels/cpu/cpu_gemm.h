// Matrix products on the CPU through Eigen. Low-precision inputs are widened to FP32
// exactly, multiplied and summed in FP32 and rounded once on output: the numerics of a
// tensor core. Moves (M*K + K*N + M*N) elements, does 2*M*N*K flops.
#pragma once
#include "engine/backend.h"

namespace belay {

void cpu_gemm(const GemmArgs& args);

}  // namespace belay
