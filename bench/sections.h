// The sections of the CPU benchmark run. Each measures one thing, checks its results and
// returns its numbers as JSON; bench/report.cpp turns the merged JSON into the table and
// the target verdicts.
#pragma once
#include <string>
#include <utility>

#include "bench/fma_peak.h"
#include "bench/harness.h"
#include "engine/dtype.h"
#include "engine/random.h"
#include "engine/tensor.h"
#include "kernels/cpu/cpu_isa.h"

namespace belay::bench {

Json bench_stream(const Options& o);   // copy and triad bandwidth, buffers >> L3
Json bench_amp(const Options& o);      // fused vs unfused AMP step vs AdamW alone
Json bench_gemm(const Options& o);     // belay's matmul vs Eigen direct, linear layer products
Json bench_train(const Options& o);
Json bench_data(const Options& o);     // synthetic data time / belted Linear(4096) step time, per ISA path    // whole training steps: samples/s, belts on/off, allocations
Json bench_threads(const Options& o);  // 1 thread vs 2 threads on the kernels above
Json bench_isa(const Options& o);      // per CPU ISA path: FMA peak, fp32 GEMM and its fraction of the peak
Json bench_anomaly(const Options& o);  // a belted step with and without anomaly mode: the ratio
Json bench_rows(const Options& o);     // LayerNorm and softmax rows, forward and backward: GB/s vs copy
Json bench_gpt(const Options& o);      // GPT block forward + backward, the GPT training step, its parts
Json bench_attention(const Options& o);  // fused vs naive attention: time at two shapes, peak memory over T
Json bench_census(const Options& o);     // the guard with and without the census, per CPU ISA path
Json bench_loss(const Options& o);       // the fused cross-entropy alone: [4096, 256], [1024, 50304] fp32

// Training configurations, timed (bench_train runs the grid; bench_threads reuses it).
struct TrainModel {
  std::string name;
  int64_t in, hidden, out;
  int layers;  // 1: a single Linear
};
// The configuration without and with the belts, stepped alternately; (plain, belted) rows.
std::pair<Json, Json> train_pair(const TrainModel& spec, DType dtype, int warmup, int reps);

// Helpers shared by the sections.
double stream_copy_gbs(size_t bytes_per_array, int reps);  // one copy measurement, GB/s (median)
int max_threads();
// An FP32 [r, c] matrix of values uniform in [-bound, bound).
Tensor random_matrix(int64_t r, int64_t c, float bound, Rng& rng);
// The limit of BF16 x BF16 products on `isa` (bench/isa.cpp): VDPBF16PS's loop on avx512bf16,
// TDPBF16PS's tiles on amx (key "dot_peak" or "tile_peak", its time and GFLOP/s); elsewhere
// BF16 is widened to FP32 and the limit is the FP32 FMA peak given (key "peak", no time).
struct Bf16Limit {
  const char* key;
  Json time;
  double gflops;
};
Bf16Limit bf16_limit(CpuIsa isa, int reps, double fp32_peak);
// One run of the FP32 FMA peak loop of `isa` (bench/fma_peak.h), `iters` iterations on all
// threads (avx512bf16 and amx run avx512's: the same FP32 FMAs).
PeakRun run_peak(CpuIsa isa, int64_t iters);
// Checks a peak loop's lanes (each ends at exactly 1) and returns its GFLOP/s at time t.
double peak_gflops(const std::string& what, const Timing& t, const PeakRun& run);
// C = op(A) op(B): 16 sampled entries against an FP64 dot product (CheckFailure if off).
void check_product(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, const std::string& what);

}  // namespace belay::bench
