// Launchers of the CUDA kernels, callable from host C++ (the backend object). Each takes
// raw device pointers and a stream; checking shapes is the caller's job.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"

namespace belay {

void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream);
void launch_fill(void* dst, DType dtype, int64_t n, float value, cudaStream_t stream);

}  // namespace belay
