// Which GEMM kernel serves a problem. FP16/BF16: the mma.sync tensor-core kernel (sm_80 and
// sm_90 alike). FP32: the SIMT kernel. cuBLAS is never used here (only bench/ and tests).
#include "kernels/cuda/gemm_kernels.h"

namespace belay {

void launch_gemm(const GemmProblem& p) {
  if (p.m == 0 || p.n == 0) return;
  if (p.ab_dtype == DType::F32) {
    launch_gemm_simt_f32(p);
    return;
  }
  // The door for Hopper: a wgmma.mma_async + TMA, warp-specialised kernel would be chosen
  // here when the device is sm_90 and the binary carries compute_90a (build with
  // CMAKE_CUDA_ARCHITECTURES including 90a; guard its body with
  // __CUDA_ARCH_FEAT_SM90_ALL so plain sm_90 still compiles). Not written yet:
  //   if (device_is_sm90() && gemm_wgmma_available() && p.m >= 128 && p.n >= 128)
  //     return launch_gemm_wgmma(p);
  launch_gemm_tensor_core(p);
}

}  // namespace belay
