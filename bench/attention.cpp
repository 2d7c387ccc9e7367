// attention: the fused op (autograd/ops.h attention, kernels/cpu/attention_kernels.cpp) against
// the three-op path it replaces (bmm, causal softmax, bmm), causal, through autograd as the GPT
// runs them, on the active CPU ISA path:
//   time:   forward alone and forward + backward (y = attention(q, k, v); sum(y * g) backward)
//           at GPT-2 small's attention (B 4, H 12, T 1024, d 64; quick: T 256) and the default
//           demo GPT's (B 32, H 4, T 64, d 32), fp32 and bf16 (bf16 under autocast), with the
//           GFLOP/s of the useful work: causal attention is 2 T^2 d per head forward (half of
//           the 4 T^2 d products: the masked half need not be computed) and 5 T^2 d backward
//           (2.5x: the scores recomputed, dP, dS to dq, dk and dv);
//   memory: the allocator's peak bytes in use above the inputs during forward + backward, at
//           T = 256, 512, 1024 and 2048 (B 1, H 12, d 64): fused should grow as T, naive as T^2.
// Check (after timing): fused against naive in fp32 on the timed inputs, the worst difference
// within 1e-4 of max |naive| (both are within a few FP32 ulps of the exact result).
#include <algorithm>
#include <cmath>

#include "amp/autocast.h"
#include "autograd/ops.h"
#include "bench/sections.h"
#include "engine/allocator.h"

namespace belay::bench {
namespace {

struct AttnShape {
  const char* name;
  int64_t batch, heads, tokens, dim;
};

Var naive_attention(const Var& q, const Var& k, const Var& v) {
  const float s = 1.0f / std::sqrt(static_cast<float>(q.shape().dims().back()));
  return bmm(softmax(scale(bmm(q, k, false, true), s), true), v);
}

struct AttnRun {
  Var q, k, v;
  Tensor g;
  AttnRun(const AttnShape& s, uint64_t seed) {
    Rng rng(seed);
    const Shape shape{s.batch, s.heads, s.tokens, s.dim};
    q = Var(random_matrix(s.batch * s.heads * s.tokens, s.dim, 1.0f, rng).reshape(shape), true);
    k = Var(random_matrix(s.batch * s.heads * s.tokens, s.dim, 1.0f, rng).reshape(shape), true);
    v = Var(random_matrix(s.batch * s.heads * s.tokens, s.dim, 1.0f, rng).reshape(shape), true);
    g = random_matrix(s.batch * s.heads * s.tokens, s.dim, 1.0f, rng).reshape(shape);
  }
  void step(bool fused, DType dt, bool backward) {
    Autocast autocast(dt, dt != DType::F32);
    const Var y = fused ? attention(q, k, v, true) : naive_attention(q, k, v);
    if (!backward) return;
    q.zero_grad(), k.zero_grad(), v.zero_grad();
    sum(mul(y, Var(g))).backward();
  }
};

Json time_rows(const AttnShape& s, int warm, int reps) {
  Json out = Json::array();
  const double heads = static_cast<double>(s.batch * s.heads), t = static_cast<double>(s.tokens);
  const double fwd_flops = 2.0 * heads * t * t * s.dim, bwd_flops = 2.5 * fwd_flops;
  for (DType dt : {DType::F32, DType::BF16}) {
    AttnRun r(s, 11);
    for (bool fused : {true, false}) {
      const Timing f = time_it(warm, reps, [&] { r.step(fused, dt, false); });
      const Timing fb = time_it(warm, reps, [&] { r.step(fused, dt, true); });
      out.push_back(Json{{"shape", s.name}, {"path", fused ? "fused" : "naive"}, {"dtype", dtype_name(dt)},
                         {"forward", to_json(f)}, {"forward_backward", to_json(fb)},
                         {"forward_gflops", fwd_flops / (f.median_ms * 1e6)},
                         {"forward_backward_gflops", (fwd_flops + bwd_flops) / (fb.median_ms * 1e6)}});
    }
  }
  return out;
}

// The extra bytes one forward + backward holds at its busiest, above the inputs.
double peak_extra_bytes(AttnRun& r, bool fused) {
  CachingAllocator& a = allocator_for(Device::cpu());
  a.release_cached();
  const size_t before = a.stats().bytes_in_use;
  a.reset_peak();
  r.step(fused, DType::F32, true);
  r.q.zero_grad(), r.k.zero_grad(), r.v.zero_grad();
  return static_cast<double>(a.stats().peak_bytes_in_use - before);
}

void check_against_naive(const AttnShape& s) {
  AttnRun r(s, 12);
  NoGrad no_grad;
  const std::vector<float> f = attention(r.q, r.k, r.v, true).value().to_vector();
  const std::vector<float> n = naive_attention(r.q, r.k, r.v).value().to_vector();
  double worst = 0.0, mag = 0.0;
  for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::fabs(double(f[i]) - n[i])), mag = std::max(mag, std::fabs(double(n[i])));
  require(worst <= 1e-4 * mag, std::string("attention ") + s.name + ": fused and naive differ by " + std::to_string(worst));
}

}  // namespace

Json bench_attention(const Options& o) {
  const AttnShape gpt2{"gpt2_small", 4, 12, o.quick ? 256 : 1024, 64}, demo{"demo", 32, 4, 64, 32};
  const int warm = o.quick ? 1 : 2, reps = o.quick ? 3 : 7;
  Json time = time_rows(gpt2, warm, reps);
  for (Json& row : time_rows(demo, warm, reps)) time.push_back(row);
  Json memory = Json::array();
  for (int64_t t : {256, 512, 1024, 2048}) {
    if (o.quick && t > 512) break;
    AttnRun r(AttnShape{"memory", 1, 12, t, 64}, 13);
    const double input_bytes = 3.0 * 12 * t * 64 * 4;
    memory.push_back(Json{{"tokens", t}, {"fused_extra_bytes", peak_extra_bytes(r, true)},
                          {"naive_extra_bytes", peak_extra_bytes(r, false)}, {"input_bytes", input_bytes}});
  }
  check_against_naive(AttnShape{"check", 2, 3, 200, 64});
  return Json{{"threads", max_threads()}, {"time", time}, {"memory", memory}};
}

}  // namespace belay::bench
