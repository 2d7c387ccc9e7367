// Between the emulator's parts: runtime.cpp (the CUDA runtime calls, the stream queues)
// hands a validated launch to simt.cpp (the scheduler), which runs its grid; other emulated
// libraries (NCCL) queue their work on a stream through enqueue_on_stream.
#pragma once
#include <cstdint>
#include <functional>
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

// The stream's later work waits until `done()` holds (the ring has finished). A call that
// waits for the device (a synchronize, a synchronous copy) waits for it; a launch or an event
// query never blocks the host on it, as a GPU's stream waiting for a NCCL kernel does not.
void enqueue_stall_on_stream(cudaStream_t stream, std::function<bool()> done);

// Whether p is inside a cudaMalloc allocation (not pinned host memory), and its bounds: the
// memory metrics count these accesses as global memory.
bool device_allocation(const void* p, uintptr_t* lo, uintptr_t* hi);

// BELAY_EMU_SEED (default 1): the schedule of threads and blocks, and of the stream queues.
uint64_t emulator_seed();

// The kernel's name as the coverage report and fault reports print it, from the compiler's
// __PRETTY_FUNCTION__: gcc spells a template kernel with its arguments
// ("gemm_tc_kernel<true, true, false>"), clang (the CI build) with its name alone.
std::string short_kernel_name(const char* pretty_function);

// Queues `op` on `stream` (0: the legacy default stream), behind the stream's work and what
// the legacy stream's implicit synchronisation adds, as a kernel launch would be queued; it
// runs on the emulated device when its turn comes, under the runtime's lock. A stream that
// is not one (or cudaStreamPerThread), or a context lost to a fault, records that error as
// the thread's last error and the operation never runs. (The emulated NCCL posts a
// collective to its ring there.)
void enqueue_on_stream(cudaStream_t stream, std::function<void()> op);

}  // namespace belay::emu
