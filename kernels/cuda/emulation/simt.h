// The SIMT execution layer: runs kernels/cuda's own kernels on the CPU, one fiber per CUDA
// thread, so that CI executes them without a GPU. This header is what an emulated kernel
// sees (through cuda_shim.h): its thread's coordinates, the block barrier, the warp
// collectives, per-block shared memory and the host twins of the PTX it uses (cp.async,
// ldmatrix, mma.sync). simt.cpp holds the scheduler, the race check and the coverage count;
// runtime.cpp the CUDA runtime calls. Only BELAY_CUDA_EMULATION builds compile any of it.
#pragma once
#include <cuda_runtime.h>  // dim3, uint3, cudaStream_t: the real runtime's types

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace belay::emu {

// ---- What a running CUDA thread sees ------------------------------------------------------
struct ThreadCoords {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// The coordinates of the CUDA thread running now (a fiber of the current block). Calling
// these outside a kernel is a bug of the emulator's user and stops the process.
const ThreadCoords& coords();

void syncthreads();  // __syncthreads: every thread of the block, or a reported divergence
void syncwarp(unsigned mask);

// Warp collectives on 64-bit payloads: the lanes of `mask` all arrive, then each gets its
// result. kind: which operation; param: the shuffle's lane or delta.
enum class WarpOp : int { Shfl, ShflUp, ShflDown, ShflXor, Ballot, Any, All };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width);

// ---- Shared memory ------------------------------------------------------------------------
// One allocation per declaration and block, of exactly the declared size (AddressSanitizer
// sees the end of each), filled with 0xFF bytes (a NaN in every float format) when the block
// starts, as real shared memory holds whatever the last block left. `site` tells the
// declarations apart; `dynamic` is the launch's dynamic shared memory.
void* block_shared(const void* site, size_t bytes, size_t align);
void* dynamic_shared(size_t align);
// __cvta_generic_to_shared: a generic pointer into this block's shared memory as a 32-bit
// shared-window address (static declarations first, then the dynamic region, as on a GPU).
uint32_t shared_address(const void* generic);

// ---- Vector accesses ------------------------------------------------------------------------
// A vector access (float2, float4, uint4, ...: 8 or 16 bytes) at an address not aligned to
// its width: the GPU faults with cudaErrorMisalignedAddress, where x86 would forgive it.
// Returns whether p is aligned to `width`; if not, the fault is reported (the grid stops, the
// error is sticky, the message names the kernel and the thread) and the caller skips the
// access. device_access.cuh's load_vector/store_vector call it before every vector access.
bool vector_access_aligned(const void* p, size_t width, bool write);

// ---- PTX twins (the GEMM's cp.async pipeline, ldmatrix and mma.sync) -----------------------
// cp.async.cg.shared.global [dst], [src], 16, src_bytes: nothing lands until the thread's
// wait_group retires its group, as on hardware where a missing wait reads stale data. Both
// addresses must be 16-byte aligned (a misaligned one faults as above, and copies nothing).
void cp_async_16(uint32_t dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 and mma.sync.aligned.m16n8k16.row.col
// with FP32 accumulators: warp collectives computed from the PTX ISA's fragment tables
// (warp_matrix.h, through gemm_layout.h).
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16);

// ---- Launch -------------------------------------------------------------------------------
// A kernel launch as the runtime receives it: the configuration, the kernel's name (for the
// coverage report and error messages), its host address (for cudaFuncSetAttribute) and a
// type-erased body that every thread runs.
struct LaunchBody {
  virtual ~LaunchBody() = default;
  virtual void run_thread() = 0;  // the kernel, once, in the calling fiber
};
void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            LaunchBody* body);  // takes ownership of body

// The name of kernel K as the compiler spells it (templates with their arguments).
template <auto K>
const char* kernel_name() {
  return __PRETTY_FUNCTION__;
}

template <auto K, class... Params>
struct KernelCall final : LaunchBody {
  std::tuple<std::remove_cv_t<std::remove_reference_t<Params>>...> args;
  template <class... A>
  explicit KernelCall(A&&... a) : args(std::forward<A>(a)...) {}
  void run_thread() override { std::apply(K, args); }
};

template <auto K, class... Params, class... Args>
void launch_kernel(void (*)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "a kernel launch with the wrong number of arguments");
  // The arguments are converted to the kernel's parameter types and copied at the launch,
  // as the CUDA runtime copies them into the launch's parameter buffer.
  auto* body = new KernelCall<K, Params...>(static_cast<std::remove_cv_t<std::remove_reference_t<Params>>>(args)...);
  launch(reinterpret_cast<const void*>(K), kernel_name<K>(), grid, block, smem, stream, body);
}

// A kernel's __launch_bounds__ (its maximum threads per block), which a host compiler drops:
// the emulated build's generated translation units register it (launch_bounds.py), and a
// launch of more threads fails as on a GPU. Keyed by the kernel's name without template
// arguments; returns true so that a namespace-scope constant can make the call.
bool register_launch_bounds(const char* kernel, int max_threads);

// ---- For tests of the emulator itself -------------------------------------------------------
// How many races (and other kernel faults) the emulator has reported in this process.
int faults_reported();
// Draws the stream queues' schedule from `seed` from now on, as BELAY_EMU_SEED=seed would have
// from the start: one process can show that two seeds order two streams' work differently.
void reseed_stream_order(uint64_t seed);

}  // namespace belay::emu
