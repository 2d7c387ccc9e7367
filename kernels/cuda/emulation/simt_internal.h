// Between the emulator's two halves: runtime.cpp (the CUDA runtime calls, the stream queue)
// hands a validated launch to simt.cpp (the scheduler), which runs its grid.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/emulation/simt.h"

namespace belay::emu {

struct GridLaunch {
  const void* kernel = nullptr;
  std::string name;
  dim3 grid, block;
  size_t smem = 0;
  std::unique_ptr<LaunchBody> body;
  // Set by run_grid with a fault: the CUDA error it makes sticky (cudaErrorLaunchFailure, or
  // cudaErrorMisalignedAddress for a misaligned vector access, as the GPU reports each).
  cudaError_t fault_error = cudaSuccess;
};

// Runs every block of the grid, in an order drawn from the seed. Returns "" or, for a fault
// (a race, a divergent barrier, a deadlock, an out-of-bounds shared access, a misaligned
// vector access), its report; launch.fault_error is then the fault's CUDA error.
std::string run_grid(GridLaunch& launch);

// Whether p is inside a cudaMalloc allocation (not pinned host memory), and its bounds: the
// memory metrics count these accesses as global memory.
bool device_allocation(const void* p, uintptr_t* lo, uintptr_t* hi);

// BELAY_EMU_SEED (default 1): the schedule of threads and blocks, and of the stream queue.
uint64_t emulator_seed();

// The kernel's name as the coverage report and fault reports print it, from the compiler's
// __PRETTY_FUNCTION__: gcc spells a template kernel with its arguments
// ("gemm_tc_kernel<true, true, false>"), clang (the CI build) with its name alone.
std::string short_kernel_name(const char* pretty_function);

}  // namespace belay::emu
