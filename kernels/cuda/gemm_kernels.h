// The GEMM kernels behind launch_gemm (gemm_dispatch.cu chooses one).
#pragma once
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_layout.h"

namespace belay {

// FP16/BF16 A and B, mma.sync (sm_80+). Needs 16-byte aligned rows (rows_aligned) for A
// and B; the caller pads other operands first (launch_pad_rows into gemm::padded_ld(cols)).
void launch_gemm_tensor_core(const GemmProblem& p);
bool rows_aligned(const void* base, int64_t ld);
void launch_pad_rows(const void* src, int64_t rows, int64_t cols, void* dst);  // 16-bit elements
void launch_gemm_simt_f32(const GemmProblem& p);     // FP32 A and B, CUDA cores
// How many blocks of the tensor-core GEMM (forward layout, FP16) this GPU runs at once per
// SM, as the occupancy calculator says (for the benchmark's report).
int gemm_tensor_core_blocks_per_sm();

}  // namespace belay
