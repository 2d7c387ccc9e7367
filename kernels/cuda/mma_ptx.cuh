// The PTX the tensor-core kernels use (gemm_tensor_core.cu, attention_kernels.cu), as inline
// functions: cp.async with its groups, ldmatrix.x4 (.trans) and mma.sync m16n8k16 with FP32
// accumulators. The emulated build runs the emulator's host twins of the same instructions.
#pragma once
#include <cstdint>

#include "kernels/cuda/simt_seam.cuh"

namespace belay::ptx {

// ---- PTX wrappers (PTX ISA: cp.async, ldmatrix, mma) -------------------------------------
// The emulated build (kernels/cuda/emulation/) runs host twins of the same instructions
// instead: cp.async held back until its wait_group, ldmatrix and mma.sync as warp
// collectives computed from the PTX ISA's fragment tables.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if BELAY_CUDA_EMULATION
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  emu::cp_async_16(dst, src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  emu::cp_async_wait(kPending);
}
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  emu::ldmatrix_x4(r, addr, kTrans);
}
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::mma_m16n8k16(d, a, b, kBf16);
}
#else
// 16 bytes global -> shared, bypassing L1 (.cg); src_bytes < 16 zero-fills the rest.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

}  // namespace belay::ptx
