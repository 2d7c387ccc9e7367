// The AMP step's optimizer half on N parameters (FP32 masters, m, v and gradients, an FP16
// working copy; loss scale 2^16), three ways:
//   fused:   guard (reads g) + clip_coefficient + AdamW (reads g, p, m, v; writes p, m, v, w)
//   unfused: PyTorch's order: unscale_ in place (r+w g), norm (r g), clip in place (r+w g),
//            AdamW with inv_scale = clip = 1
//   adamw:   the AdamW pass alone
// Bytes are what each sequence must move by design, counted as STREAM counts (reads +
// writes): fused 34 B/param, unfused 50, AdamW 30. So on a memory-bound machine unfused can
// be at most 50/34 = 1.47x slower than fused: the ratio this benchmark reports has that
// ceiling, whatever the kernels.
//
// Check: a sample of elements is replayed on the host with the element math of
// kernels/common (the same formula, scalar) for every repetition the benchmark ran, and
// must match bit for bit; the guard's norm must match the root of an FP64 sum.
#include <cmath>
#include <cstring>
#include <vector>

#include "bench/sections.h"
#include "engine/backend.h"
#include "engine/random.h"
#include "kernels/common/element_math.h"

namespace belay::bench {
namespace {

constexpr float kScale = 65536.0f;
constexpr int kTensors = 8;  // a model's parameters come in several tensors

struct State {
  std::vector<Tensor> p, m, v, g, w;
  int64_t n = 0;
};

State make_state(int64_t n, uint64_t seed) {
  State s;
  s.n = n;
  Rng rng(seed);
  const int64_t per = n / kTensors;
  for (int t = 0; t < kTensors; ++t) {
    const int64_t len = t == kTensors - 1 ? n - per * (kTensors - 1) : per;
    Tensor p = Tensor::empty(Shape{len}), m = Tensor::empty(Shape{len}), v = Tensor::empty(Shape{len});
    Tensor g = Tensor::empty(Shape{len});
    float *pp = p.data_as<float>(), *pm = m.data_as<float>(), *pv = v.data_as<float>(), *pg = g.data_as<float>();
    for (int64_t i = 0; i < len; ++i) {
      pp[i] = rng.uniform(-0.05f, 0.05f);
      pm[i] = rng.uniform(-1e-3f, 1e-3f);
      pv[i] = rng.uniform(0.0f, 1e-6f);
      pg[i] = kScale * rng.uniform(-1e-2f, 1e-2f);  // a scaled gradient
    }
    s.w.push_back(p.to(DType::F16));
    s.p.push_back(p);
    s.m.push_back(m);
    s.v.push_back(v);
    s.g.push_back(g);
  }
  return s;
}

std::vector<AdamWSlot> slots_of(State& s) {
  std::vector<AdamWSlot> out;
  for (int t = 0; t < kTensors; ++t) out.push_back({&s.p[t], &s.m[t], &s.v[t], &s.g[t], &s.w[t], 0.01f});
  return out;
}

// Sampled elements, kept on the host for the replay.
struct Sample {
  int t;
  int64_t i;
  float p, m, v, g;
};

std::vector<Sample> take_sample(const State& s, uint64_t seed) {
  Rng rng(seed);
  std::vector<Sample> out;
  for (int k = 0; k < 2048; ++k) {
    const int t = static_cast<int>(rng.next_u64() % kTensors);
    const int64_t i = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(s.p[t].numel()));
    out.push_back({t, i, s.p[t].data_as<float>()[i], s.m[t].data_as<float>()[i], s.v[t].data_as<float>()[i],
                   s.g[t].data_as<float>()[i]});
  }
  return out;
}

// The passes run with the applied-step count held at 0 (every repetition is step t = 1),
// so the replay applies the same lr and bias corrections 1 - beta each time.
constexpr float kLr = 1e-3f;
const AdamWHyper kHyper{};

// Replays `steps` AdamW steps on the sample; grad_at(step, stored) gives the gradient the
// optimizer applies. Every sampled element of p, m, v and the working copy must match.
template <class GradAt>
void check_replay(const State& s, std::vector<Sample> sample, int steps, GradAt&& grad_at, const char* what) {
  const AdamWHyper h = kHyper;
  const float bc1 = adamw_bias_correction(h.beta1, 0.0f), bc2 = adamw_bias_correction(h.beta2, 0.0f);
  for (Sample& e : sample) {
    for (int k = 0; k < steps; ++k)
      adamw_element(grad_at(k, e.g), e.p, e.m, e.v, kLr, h.beta1, h.beta2, h.eps, 0.01f, bc1, bc2);
    const bool same = f32_bits(e.p) == f32_bits(s.p[e.t].data_as<float>()[e.i]) &&
                      f32_bits(e.m) == f32_bits(s.m[e.t].data_as<float>()[e.i]) &&
                      f32_bits(e.v) == f32_bits(s.v[e.t].data_as<float>()[e.i]) &&
                      f32_to_f16_bits(e.p) == s.w[e.t].data_as<uint16_t>()[e.i];
    if (!same)  // the message built only on a failure, not once per sample
      check_failed(std::string(what) + ": p, m, v or the working copy differ from the scalar reference at tensor " +
                   std::to_string(e.t) + " index " + std::to_string(e.i));
  }
}

double fp64_sumsq(const State& s, float inv) {
  double total = 0.0;
  for (const Tensor& g : s.g) {
    const float* pg = g.data_as<float>();
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double u = static_cast<double>(pg[i] * inv);
      total += u * u;
    }
  }
  return total;
}

}  // namespace

Json bench_amp(const Options& o) {
  const Backend& be = backend_for(Device::cpu());
  const double copy_gbs = stream_copy_gbs((o.quick ? 64ull : 256ull) << 20, o.quick ? 3 : 5);
  Json sizes = Json::array();
  const std::vector<int64_t> ns = o.quick ? std::vector<int64_t>{1 << 20, 1 << 22}
                                          : std::vector<int64_t>{1 << 20, 16 << 20, 64 << 20};
  for (const int64_t n : ns) {
    const int reps = n <= (1 << 20) ? 40 : n <= (16 << 20) ? 10 : 6;
    const AdamWHyper h = kHyper;
    const Tensor inv = Tensor::scalar(1.0f / kScale), one = Tensor::scalar(1.0f), zero = Tensor::scalar(0.0f);
    const Tensor lr = Tensor::scalar(kLr), applied = Tensor::scalar(0.0f);
    Tensor found = Tensor::scalar(0.0f), norm = Tensor::scalar(0.0f);
    Tensor coef = Tensor::scalar(0.0f);
    const float max_norm = INFINITY;  // clip coefficient 1: every pass still runs
    Json row{{"params", n}, {"tensors", kTensors}};

    // (a) fused.
    {
      State s = make_state(n, 1);
      const std::vector<Sample> sample = take_sample(s, 2);
      std::vector<const Tensor*> grads;
      for (const Tensor& g : s.g) grads.push_back(&g);
      const std::vector<AdamWSlot> slots = slots_of(s);
      const Timing t = time_it(2, reps, [&] {
        be.guard(grads, inv, found, norm);
        be.clip_coefficient(norm, max_norm, coef);
        be.adamw(h, slots, StepScalars{&inv, &coef, &found, &lr, &applied});
      });
      require(found.item() == 0.0f && coef.item() == 1.0f, "fused: guard flags");
      const double ref = fp64_sumsq(s, 1.0f / kScale);
      require(std::fabs(norm.item() - std::sqrt(ref)) <= 1e-5 * std::sqrt(ref), "fused: guard norm vs fp64");
      check_replay(s, sample, 2 + reps, [&](int, float g) { return effective_grad(g, 1.0f / kScale, 1.0f); }, "fused");
      row["fused"] = Json{{"time", to_json(t)}, {"bytes_per_param", 34}};
    }
    // (b) unfused, PyTorch's order. The in-place unscale alternates 2^-16 and 2^16 so every
    // repetition does the same work on the same magnitudes (nothing drifts to subnormals).
    {
      State s = make_state(n, 1);
      const std::vector<Sample> sample = take_sample(s, 2);
      std::vector<Tensor*> grads;
      std::vector<const Tensor*> cgrads;
      for (Tensor& g : s.g) {
        grads.push_back(&g);
        cgrads.push_back(&g);
      }
      const std::vector<AdamWSlot> slots = slots_of(s);
      const Tensor up = Tensor::scalar(kScale);
      Tensor found_norm = Tensor::scalar(0.0f);
      int rep = 0;
      const Timing t = time_it(2, reps, [&] {
        be.unscale_inplace(grads, rep++ % 2 == 0 ? inv : up, found);
        be.guard(cgrads, one, found_norm, norm);  // the norm: clip_grad_norm_'s pass
        be.clip_coefficient(norm, max_norm, coef);
        be.scale_inplace(grads, coef);
        be.adamw(h, slots, StepScalars{&one, &one, &found, &lr, &applied});
      });
      require(found.item() == 0.0f, "unfused: found_inf");
      check_replay(s, sample, 2 + reps,
                   [&](int k, float g) {
                     const float u = k % 2 == 0 ? g * (1.0f / kScale) : g;  // what the buffer holds after unscale
                     return effective_grad(u * 1.0f, 1.0f, 1.0f);
                   },
                   "unfused");
      row["unfused"] = Json{{"time", to_json(t)}, {"bytes_per_param", 50}};
    }
    // (c) AdamW alone.
    {
      State s = make_state(n, 1);
      const std::vector<Sample> sample = take_sample(s, 2);
      const std::vector<AdamWSlot> slots = slots_of(s);
      const Timing t = time_it(2, reps, [&] { be.adamw(h, slots, StepScalars{&inv, &one, &zero, &lr, &applied}); });
      check_replay(s, sample, 2 + reps, [&](int, float g) { return effective_grad(g, 1.0f / kScale, 1.0f); }, "adamw");
      row["adamw"] = Json{{"time", to_json(t)}, {"bytes_per_param", 30}};
    }
    for (const char* k : {"fused", "unfused", "adamw"}) {
      Json& r = row[k];
      const double bytes = r["bytes_per_param"].get<double>() * static_cast<double>(n);
      const double ms = r["time"]["median_ms"].get<double>();
      r["bytes_moved"] = bytes;
      r["gb_per_s"] = bytes / (ms * 1e6);
      r["fraction_of_copy"] = bytes / (ms * 1e6) / copy_gbs;
    }
    row["unfused_over_fused"] =
        row["unfused"]["time"]["median_ms"].get<double>() / row["fused"]["time"]["median_ms"].get<double>();
    row["unfused_over_fused_bytes_bound"] = 50.0 / 34.0;
    sizes.push_back(row);
  }
  return Json{{"threads", max_threads()}, {"copy_gb_per_s_same_section", copy_gbs}, {"sizes", sizes}};
}

}  // namespace belay::bench
