#!/usr/bin/env python3
"""Plants one known bug in a copy of a kernel file, for the planted_bugs test.

    plant.py BUG SOURCE_ROOT OUT_FILE

Each bug is one exact text replacement in one file of kernels/cuda/ (a kernel, or the host code
that drives them). The text must occur
exactly once: if the kernels change so that it no longer does, this fails loudly instead of
planting nothing (a planted-bug test that plants no bug would pass for the wrong reason).
"""
import pathlib
import sys

BUGS = {
    # The block reduction's barrier after each tree step: thread i then reads
    # scratch[i + stride] while thread i + stride may still be writing it.
    "block_sum_barrier": (
        "kernels/cuda/block_reduce.cuh",
        "    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];\n"
        "    __syncthreads();\n",
        "    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];\n",
    ),
    # The GEMM pipeline's wait for tile kt: the mma reads a stage whose copies have not landed.
    "gemm_wait_group": (
        "kernels/cuda/gemm_tensor_core.cu",
        "    cp_async_wait<kStages - 2>();\n    __syncthreads();\n",
        "    __syncthreads();\n",
    ),
    # The batch stride of B ignored: every item of a batched product reads B's first matrix
    # (as if B were shared over the batch). Planted in the dispatch (a small file), so the
    # mutant recompiles no kernel.
    "bmm_stride_b": (
        "kernels/cuda/gemm_dispatch.cu",
        "    GemmProblem slice = p;\n",
        "    GemmProblem slice = p;\n    slice.stride_b = 0;\n",
    ),
    # The FP32 GEMM's K-edge predicate off by one: with K = 129 it reads element 129 of a row.
    "edge_predicate_k": (
        "kernels/cuda/gemm_simt_f32.cu",
        "if (gm < p.m && gk < p.k) va =",
        "if (gm < p.m && gk <= p.k) va =",
    ),
    # A swizzle that maps two chunks of a row to one 16-byte slot: two threads' cp.async
    # write the same shared-memory words.
    "swizzle_collision": (
        "kernels/cuda/gemm_layout.h",
        "BELAY_HD constexpr int swizzle_chunk(int row, int chunk) { return chunk ^ (row & 7); }",
        "BELAY_HD constexpr int swizzle_chunk(int row, int chunk) { return (chunk ^ (row & 7)) & 6; }",
    ),
    # The emulated NCCL's ring sums the elements of range k starting from rank k-1 instead of
    # rank k (the chunks relabelled by one): every rank still ends with the same bits, within
    # any tolerance of the exact sum, but not in NCCL's order.
    "nccl_ring_order": (
        "kernels/cuda/emulation/nccl.cpp",
        "    *at = chunk_begin(len, n, c);\n    *count = chunk_begin(len, n, c + 1) - *at;\n",
        "    *at = chunk_begin(len, n, mod(c + 1, n));\n    *count = chunk_begin(len, n, mod(c + 1, n) + 1) - *at;\n",
    ),
    # No swizzle: the 8 rows that one ldmatrix phase reads at one logical chunk (and the chunks
    # 8 threads' cp.async write) fall in the same 4 banks. Results stay right; only the memory
    # metrics see the 8-way bank conflicts.
    "swizzle_off": (
        "kernels/cuda/gemm_layout.h",
        "BELAY_HD constexpr int swizzle_chunk(int row, int chunk) { return chunk ^ (row & 7); }",
        "BELAY_HD constexpr int swizzle_chunk(int row, int chunk) { return chunk + 0 * row; }",
    ),
    # Each block's chunk one element longer: the last element of a chunk is also the first of
    # the next block's, updated twice.
    "chunk_boundary": (
        "kernels/cuda/multi_tensor.cuh",
        "return {r, start, start + kChunk < r.n ? start + kChunk : r.n};",
        "return {r, start, start + kChunk + 1 < r.n ? start + kChunk + 1 : r.n};",
    ),
    # The embedding backward adds a row's occurrences last to first: every sum is within any
    # tolerance of the right one, but not the bits of the sequential loop the contract asks for.
    "embedding_sum_order": (
        "kernels/cuda/embedding_kernels.cu",
        "      for (int32_t i = begin; i < end; ++i) acc +=",
        "      for (int32_t i = end - 1; i >= begin; --i) acc +=",
    ),
    # The bucketing block's barrier at the end of a chunk: a thread writes its id of the next
    # chunk into rows[] while another still compares with the previous chunk's.
    "embedding_chunk_barrier": (
        "kernels/cuda/embedding_kernels.cu",
        "    __syncthreads();  // rows[] is rewritten by the next chunk\n",
        "",
    ),
    # LayerNorm's parameter sums with chunks one row too long: the first row of each next chunk
    # is added into dweight and dbias twice.
    "layer_norm_chunk_overlap": (
        "kernels/cuda/layer_norm_kernels.cu",
        "r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;",
        "r1 = r0 + rows_per_chunk + 1 < rows ? r0 + rows_per_chunk + 1 : rows;",
    ),
    # The host's wait in a readback: wait() reads the pinned slot before the gather kernel
    # that fills it has run (a host read before the sync).
    "readback_no_wait": (
        "kernels/cuda/pinned_transfers.cpp",
        "    if (!waited_) {\n      BELAY_CUDA_CHECK(cudaEventSynchronize(slot_->done));\n",
        "    if (!waited_) {\n",
    ),
    # The census's block sum drops the block's last lane: every count of the values that lane
    # read is one lane short (the sums of squares, found_inf and the norm are untouched).
    "census_lane": (
        "kernels/cuda/census_count.cuh",
        "    if (census.count[f] != 0u) atomicAdd(&block_census[f], census.count[f]);\n",
        "    if (census.count[f] != 0u && threadIdx.x != blockDim.x - 1) atomicAdd(&block_census[f], census.count[f]);\n",
    ),
    # The causal mask off by one: each query loses the key on its diagonal (the first query of
    # a square case then sees no key at all).
    "attention_mask_off_by_one": (
        "kernels/cuda/attention_layout.h",
        "return j < tk && (!causal || j <= i + tk - tq);",
        "return j < tk && (!causal || j < i + tk - tq);",
    ),
    # The online softmax's running sum not rescaled when the running max moves: the keys of
    # earlier tiles count with their old, too large weights.
    "attention_sum_not_rescaled": (
        "kernels/cuda/attention_forward_tc.cu",
        "l[h] = l[h] * alpha[h] + sum[h];",
        "l[h] = l[h] + sum[h];",
    ),
    # The forward's log-sum-exp never written: lse holds whatever the allocator's block held, and
    # the backward recomputes P from it.
    "attention_lse_not_saved": (
        "kernels/cuda/attention_forward_tc.cu",
        "      if (row < tq) lse[item * tq + row] =",
        "      if (row < 0) lse[item * tq + row] =",
    ),
    # The barrier after a key tile's math: a warp's cp.async of tile kt + 2 overwrites the stage
    # that slower warps still read tile kt from (the race check sees it with 3 or more tiles).
    "attention_stage_barrier": (
        "kernels/cuda/attention_forward_tc.cu",
        "    __syncthreads();  // every warp done with stage kt % 2 before tile kt + 2 is copied into it\n",
        "",
    ),
    # The tensor-core backward's score gradient without its D term: dS = P dP instead of
    # P (dP - D), in both of its kernels. dV is untouched; dQ and dK are off by P D scaled.
    "attention_bwd_ds_no_dsum": (
        "kernels/cuda/attention_backward_tc.cu",
        "{ return p * (dp - dsum); }",
        "{ return p * dp + 0.0f * dsum; }",
    ),
    # The barrier after a query tile in the backward's dK / dV kernel: a warp's cp.async of Q and
    # dO for tile qt + 2 (and its lse / D stores) overwrite the stage slower warps still read.
    "attention_bwd_stage_barrier": (
        "kernels/cuda/attention_backward_tc.cu",
        "    __syncthreads();  // every warp done with this stage before tile qt + 2 is copied into it\n",
        "",
    ),
}


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in BUGS:
        print(f"usage: plant.py {{{'|'.join(BUGS)}}} SOURCE_ROOT OUT_FILE", file=sys.stderr)
        return 2
    rel, find, replace = BUGS[sys.argv[1]]
    text = (pathlib.Path(sys.argv[2]) / rel).read_text()
    count = text.count(find)
    if count != 1:
        print(f"plant.py: {sys.argv[1]}: the text to replace occurs {count} times in {rel}, not once", file=sys.stderr)
        return 1
    out = pathlib.Path(sys.argv[3])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text.replace(find, replace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
