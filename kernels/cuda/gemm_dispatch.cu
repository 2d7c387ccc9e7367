// Which GEMM kernel serves a problem. FP16/BF16: the mma.sync tensor-core kernel (sm_80 and
// sm_90 alike). FP32: the SIMT kernel. cuBLAS is never used here (only bench/ and tests).
// A batch runs along gridDim.z (at most 65535 items a launch): a longer one is launched in
// slices, each with its operands moved to the slice's first item.
#include <algorithm>

#include "kernels/cuda/gemm_kernels.h"

namespace belay {
namespace {

constexpr int64_t kMaxGridZ = 65535;

const void* item(const void* base, int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(dtype_size(dtype));
}

void launch_slice(const GemmProblem& p) {
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

}  // namespace

void launch_gemm(const GemmProblem& p) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  for (int64_t first = 0; first < p.batch; first += kMaxGridZ) {
    GemmProblem slice = p;
    slice.batch = std::min(kMaxGridZ, p.batch - first);
    slice.a = item(p.a, first * p.stride_a, p.ab_dtype);
    slice.b = item(p.b, first * p.stride_b, p.ab_dtype);
    slice.c = const_cast<void*>(item(p.c, first * p.m * p.n, p.c_dtype));
    launch_slice(slice);
  }
}

}  // namespace belay
