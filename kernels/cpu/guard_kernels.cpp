// The CPU backend's belts (kernels/cpu/cpu_kernels.h): the fused guard (found_inf and the
// global norm in one read of every gradient), the clip coefficient, the unfused unscale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/census.h"
#include "kernels/common/census_math.h"

#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/element_blocks.h"

namespace belay::cpu {

namespace {

// The guard's reading plan over every gradient at once. Chunk c of gradient t is its elements
// [c kReduceChunk, (c + 1) kReduceChunk) (the last one shorter), summed in order in FP64: the
// chunks of deterministic_sum_grouped, and so its bits. kReduceLanes whole chunks of one
// gradient go to the ISA kernel together (as there); every other chunk (a small gradient's
// only one, a large one's tail) joins a batch of up to kReduceLanes chunks of one dtype, from
// any gradients, summed side by side by the same kernel through 8 pointers (batch_sums): each
// chunk's order its own, where a small gradient's chunk was one chain of dependent adds on the
// plain path (the default GPT's 36 gradients are all under one group). Every item is one
// thread's; the threads share all of them.
struct Chunk {
  size_t grad;
  int64_t begin, len;
};
struct GuardItem {
  int64_t first = 0;  // a group: its first chunk (kReduceLanes of one gradient follow)
  int count = 0;      // a batch: its chunks' ids (0: a group)
  int64_t ids[kReduceLanes] = {};
};
struct GuardPlan {
  std::vector<Chunk> chunks;
  std::vector<int64_t> first;  // gradient t's chunks: [first[t], first[t + 1])
  std::vector<GuardItem> items;
  int64_t elements = 0;
};

void plan_guard(const std::vector<const Tensor*>& grads, GuardPlan& plan) {
  plan.chunks.clear(), plan.first.assign(1, 0), plan.items.clear(), plan.elements = 0;
  std::vector<int64_t> waiting[3];  // chunks for a batch, by dtype (F32, F16, BF16)
  for (size_t t = 0; t < grads.size(); ++t) {
    const int64_t n = grads[t]->numel(), count = (n + kReduceChunk - 1) / kReduceChunk;
    const int64_t grouped = n / kReduceChunk / kReduceLanes * kReduceLanes, c0 = plan.first.back();
    for (int64_t c = 0; c < count; ++c) plan.chunks.push_back(Chunk{t, c * kReduceChunk, std::min(kReduceChunk, n - c * kReduceChunk)});
    for (int64_t c = 0; c < grouped; c += kReduceLanes) plan.items.push_back(GuardItem{c0 + c, 0, {}});
    const DType dt = grads[t]->dtype();
    for (int64_t c = grouped; c < count; ++c) waiting[dt == DType::F16 ? 1 : dt == DType::BF16 ? 2 : 0].push_back(c0 + c);
    plan.first.push_back(c0 + count);
    plan.elements += n;
  }
  for (std::vector<int64_t>& w : waiting) {
    // Longest first, so a batch's chunks are about as long (a batch reads in rounds as long as
    // its shortest live chunk: fewer rounds, fewer lanes idle), and a batch ends where the next
    // chunk is under half its first's length. A chunk's sum does not depend on its batch.
    std::stable_sort(w.begin(), w.end(), [&](int64_t a, int64_t b) {
      return plan.chunks[static_cast<size_t>(a)].len > plan.chunks[static_cast<size_t>(b)].len;
    });
    for (size_t i = 0; i < w.size();) {
      // Up to kReduceLanes chunks, while they are at least half as long as the batch's first.
      const int64_t longest = plan.chunks[static_cast<size_t>(w[i])].len;
      size_t end = i + 1;
      while (end < w.size() && end - i < static_cast<size_t>(kReduceLanes) &&
             2 * plan.chunks[static_cast<size_t>(w[end])].len >= longest)
        ++end;
      GuardItem item;
      item.count = static_cast<int>(end - i);
      std::copy(w.begin() + static_cast<std::ptrdiff_t>(i), w.begin() + static_cast<std::ptrdiff_t>(end), item.ids);
      plan.items.push_back(item);
      i = end;
    }
  }
}

// A batch's chunks side by side, on the ISA path (sum_squares_8_at: 8 chunks transposed into 8
// lanes): sums[id] and, with bounds, records[id]'s census counts. In rounds as long as the
// shortest chunk still unread (lanes past the live chunks repeat the first, computed and
// dropped), each chunk's sum carried from round to round; with the census, rounds of at most
// the path's census_round values (sum_squares_census_8_at: on the AVX paths counted in the same
// loop, a flagged chunk's block again from L1, or every chunk in the loop after a block where 3
// or more chunks held values off the normal range; on the baseline path each round's chunks
// again from L1).
template <DType D>
void batch_sums(const std::vector<const Tensor*>& grads, const GuardPlan& plan, const GuardItem& item, float inv,
                const CensusBounds* bounds, double* sums, CensusCounts* records) {
  const GemmElem elem = gemm_elem_of(D);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  const char* base[kReduceLanes];
  int64_t left[kReduceLanes];
  double acc[kReduceLanes] = {};
  CensusCounts counts[kReduceLanes];
  int flagged = 0;  // chunks of the last round with values off the normal range: 3 or more, count densely
  for (int k = 0; k < item.count; ++k) {
    const Chunk& c = plan.chunks[static_cast<size_t>(item.ids[k])];
    base[k] = static_cast<const char*>(grads[c.grad]->data()) + c.begin * static_cast<int64_t>(dtype_size(D));
    left[k] = c.len;
  }
  for (;;) {
    int live[kReduceLanes], lanes = 0;
    int64_t n = bounds ? blocks_isa.census_round : INT64_MAX;
    for (int k = 0; k < item.count; ++k)
      if (left[k] > 0) live[lanes++] = k, n = std::min(n, left[k]);
    if (lanes == 0) break;
    const void* at[kReduceLanes];
    double round[kReduceLanes];
    for (int l = 0; l < kReduceLanes; ++l) {
      const int k = live[l < lanes ? l : 0];
      at[l] = base[k];
      round[l] = l < lanes ? acc[k] : 0.0;
    }
    CensusCounts round_counts[kReduceLanes];
    if (bounds)
      flagged = blocks_isa.sum_squares_census_8_at(at, lanes, elem, n, inv, *bounds, flagged >= 3, round, round_counts);
    else blocks_isa.sum_squares_8_at(at, elem, n, inv, round);
    for (int l = 0; l < lanes; ++l) {
      const int k = live[l];
      acc[k] = round[l];
      if (bounds) counts[k].merge(round_counts[l]);
      base[k] += n * static_cast<int64_t>(dtype_size(D));
      left[k] -= n;
    }
  }
  for (int k = 0; k < item.count; ++k) {
    sums[item.ids[k]] = acc[k];
    if (records) records[item.ids[k]] = counts[k];
  }
}

// Every chunk's sum of squares of the unscaled values into sums (and, with bounds, its census
// counts into records: a group's in its first chunk's), the plan's items shared by the threads.
void run_guard(const std::vector<const Tensor*>& grads, const GuardPlan& plan, float inv, const CensusBounds* bounds,
               double* sums, CensusCounts* records) {
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  const int64_t items = static_cast<int64_t>(plan.items.size());
#pragma omp parallel for schedule(dynamic, 1) if (plan.elements > kParallelThreshold)
  for (int64_t i = 0; i < items; ++i) {
    const GuardItem& item = plan.items[static_cast<size_t>(i)];
    if (item.count > 0) {
      const DType dt = grads[plan.chunks[static_cast<size_t>(item.ids[0])].grad]->dtype();
      with_dtype(dt, [&](auto tag) { batch_sums<decltype(tag)::value>(grads, plan, item, inv, bounds, sums, records); });
      continue;
    }
    const Chunk& c = plan.chunks[static_cast<size_t>(item.first)];
    const Tensor& g = *grads[c.grad];
    const char* x = static_cast<const char*>(g.data()) + c.begin * static_cast<int64_t>(dtype_size(g.dtype()));
    const GemmElem elem = gemm_elem_of(g.dtype());
    if (bounds)
      blocks_isa.sum_squares_census_8(x, elem, kReduceChunk, kReduceChunk, inv, *bounds, sums + item.first,
                                      records + item.first);
    else
      blocks_isa.sum_squares_8(x, elem, kReduceChunk, kReduceChunk, inv, sums + item.first);
  }
}

// Gradient t's sum: its chunks' in chunk order.
double grad_sum(const GuardPlan& plan, const double* sums, size_t t) {
  double s = 0.0;
  for (int64_t c = plan.first[t]; c < plan.first[t + 1]; ++c) s += sums[c];
  return s;
}

struct GuardScratch {
  GuardPlan plan;
  std::vector<double> sums;
  std::vector<CensusCounts> records;
};
GuardScratch& guard_scratch() {
  thread_local GuardScratch scratch;  // kept: a steady step allocates little here
  return scratch;
}

}  // namespace

// Reads every gradient once (4 or 2 bytes per element), writes nothing; 3 flops per element.
// partials[t]: gradient t's sum of squares of the unscaled values, in FP64.
void guard_partials(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, std::vector<double>& partials) {
  static_assert(kReduceLanes == 8, "sum_squares_8 sums 8 chunks side by side");
  GuardScratch& w = guard_scratch();
  plan_guard(grads, w.plan);
  w.sums.assign(w.plan.chunks.size(), 0.0);
  run_guard(grads, w.plan, scalar_value(inv_scale), nullptr, w.sums.data(), nullptr);
  partials.resize(grads.size());
  for (size_t t = 0; t < grads.size(); ++t) partials[t] = grad_sum(w.plan, w.sums.data(), t);
}

// The partials summed in gradient order: a sharded run (amp/dist) sums the same partials,
// gathered from their owners, in the same order, and so gets this norm's bits.
void guard(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm) {
  thread_local std::vector<double> partials;  // kept: a steady step allocates nothing here
  guard_partials(grads, inv_scale, partials);
  double total = 0.0;
  bool nonfinite = false;
  for (double s : partials) {
    if (!std::isfinite(s)) nonfinite = true;
    total += s;
  }
  found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));  // one rounding, after the root
}

// The guard and, in the same read, the census of each gradient (engine/census.h). The sums of
// squares are the guard's, in its order, so found_inf and the norm keep their bits. Each
// group of 8 chunks, and each chunk of a batch, counts into its own record (no two threads
// share one), merged per gradient after.
// Reads every gradient once; writes kCensusFields words per gradient; 3 more operations per
// 8 plain values (fewer in the wider scans), and where values sit below the normal range, on
// avx512 8 per 16 FP32 values or 6 per 32 FP16 values counted in FP16 (avx2: per 8 and 16;
// baseline: 8 per 4 FP32 values, 6 per 8 FP16 values; element_blocks.cpp).
void guard_census(const std::vector<const Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf, Tensor& norm,
                  const GuardCensus& census) {
  const CensusBounds bounds = census_bounds(census.format == DType::BF16);
  GuardScratch& w = guard_scratch();
  plan_guard(grads, w.plan);
  w.sums.assign(w.plan.chunks.size(), 0.0);
  w.records.assign(w.plan.chunks.size(), CensusCounts{});
  run_guard(grads, w.plan, scalar_value(inv_scale), &bounds, w.sums.data(), w.records.data());
  uint32_t* words = census.out->data_as<uint32_t>();
  double total = 0.0;
  bool nonfinite = false;
  for (size_t t = 0; t < grads.size(); ++t) {
    const double s = grad_sum(w.plan, w.sums.data(), t);
    if (!std::isfinite(s)) nonfinite = true;
    total += s;
    CensusCounts sum;
    for (int64_t c = w.plan.first[t]; c < w.plan.first[t + 1]; ++c) sum.merge(w.records[static_cast<size_t>(c)]);
    uint32_t* out = words + t * kCensusFields;
    out[kCensusNonfinite] = static_cast<uint32_t>(sum.nonfinite);  // each <= numel < 2^32 (backend_checks)
    out[kCensusZeros] = static_cast<uint32_t>(sum.zeros);
    out[kCensusUnderflow] = static_cast<uint32_t>(sum.underflow);
    out[kCensusSubnormal] = static_cast<uint32_t>(sum.subnormal);
    std::memcpy(&out[kCensusAmax], &sum.amax, sizeof(float));
  }
  found_inf.data_as<float>()[0] = nonfinite ? 1.0f : 0.0f;
  norm.data_as<float>()[0] = static_cast<float>(std::sqrt(total));
}

void clip_coefficient(const Tensor& norm, float max_norm, Tensor& clip_coef) {
  clip_coef.data_as<float>()[0] = clip_coefficient_of(scalar_value(norm), max_norm);
}

// Reads and writes every gradient once.
void unscale_inplace(const std::vector<Tensor*>& grads, const Tensor& inv_scale, Tensor& found_inf) {
  const float inv = scalar_value(inv_scale);
  const ElementBlocks& blocks_isa = cpu_element_blocks();
  int bad = 0;
  for (Tensor* g : grads)
    bad |= map_blocks(
        *g, [&](int64_t, int64_t len, float* r, const float* v) { return blocks_isa.unscale(v, r, len, inv); }, *g);
  found_inf.data_as<float>()[0] = bad != 0 ? 1.0f : 0.0f;
}

}  // namespace belay::cpu
