// Turning a CUDA error into belay::Error, with the call and where it happened.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "engine/error.h"

#define BELAY_CUDA_CHECK(call)                                                                        \
  do {                                                                                                \
    cudaError_t belay_err_ = (call);                                                                  \
    if (belay_err_ != cudaSuccess)                                                                    \
      throw ::belay::Error(std::string("CUDA error: ") + cudaGetErrorString(belay_err_) + " in " #call \
                           " at " __FILE__ ":" + std::to_string(__LINE__));                          \
  } while (0)
