// The fused classifier's row (llm.c's fused_classifier on the CPU), once per vector ISA
// (classifier_rows.cpp, built by kernels/cpu/isa/isa.cmake with that path's flags):
// kernels/cpu/cross_entropy_kernels.cpp runs it on every row of the logits, threads over rows.
//
// Per row of n FP32 logits, all in FP32: pass 1 reads the row once from memory, a chunk of
// kClassifierChunk values at a time (each chunk is read twice, the second time from L1): the
// chunk's maximum, the running maximum and the 16 lane sums of e^(x - running max) (rescaled
// when the maximum grows: the online log-sum-exp), each e^(x - running max) written into dx.
// Pass 2 reads dx back (from L1/L2 for rows up to ~50k classes) and turns it into the
// gradient (p - onehot) / B, p = e * (e^(chunk's max - row max) / S): one multiply per
// element, no second exp.
//
// Bits: every path does the same IEEE operations in the same order (no FMA: -ffp-contract=off
// and exp_f32 written with plain multiplies and adds; the lane sums in 16 fixed lanes, element
// j of a chunk in lane j % 16, the lanes added in a fixed tree), so every path gives the
// baseline's bits and only the vector width differs (4 lanes on baseline's SSE2, 8 on avx2,
// 8 or 16 on avx512; avx512bf16 and amx run avx512's code). A row is computed by one thread,
// so the bits do not depend on the thread count either.
#pragma once
#include <cstdint>

namespace belay {

constexpr int64_t kClassifierChunk = 512;  // FP32 values per chunk: 2 KiB, in L1 between its two reads

inline int64_t classifier_chunks(int64_t n) { return (n + kClassifierChunk - 1) / kClassifierChunk; }

struct ClassifierRows {
  // One row: x holds n >= 1 FP32 logits, 0 <= label < n. Writes dx[j] = (p_j - [j == label]) *
  // inv_rows, p = softmax(x), and returns the row's loss log(sum e^x) - x[label] (from the FP32
  // maximum and sum, in double). dx may be x (a row widened from FP16/BF16 in place). scratch
  // holds classifier_chunks(n) floats (the per-chunk scale of pass 2).
  // Non-finite logits: -inf is a class of probability 0 (its gradient 0; the loss inf when it
  // is the label's); a row of only -inf, any +inf or any NaN gives a NaN loss and NaN gradients,
  // as the FP64 formula does.
  double (*row)(const float* x, int64_t n, int64_t label, float inv_rows, float* dx, float* scratch);
};

namespace isa_baseline { extern const ClassifierRows classifier_rows; }
namespace isa_avx2 { extern const ClassifierRows classifier_rows; }
namespace isa_avx512 { extern const ClassifierRows classifier_rows; }

}  // namespace belay
