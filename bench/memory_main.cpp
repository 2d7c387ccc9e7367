// belay_bench_memory: what training a Linear(4096 -> 4096) at batch 256 holds in memory.
//   belay_bench_memory --dtype fp32|bf16|fp16 --grads fp32|low [--in N] --json FILE
// One configuration per process, so the peak RSS (VmHWM) is this run's alone.
//  - Training state per parameter, counted from the CPU allocator: bytes in use after a step
//    (masters, working copies, m, v, gradients) minus bytes in use before the model existed.
//  - Peak RSS against the prediction: RSS before anything was allocated + the allocator's
//    peak bytes in use (the data, the state and the step's activations and scratch at its
//    busiest moment). Blocks the caching allocator keeps but is not using are reported too:
//    they are what a gap between the two is made of.
#include <sys/resource.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "amp/autocast.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/allocator.h"
#include "engine/random.h"
#include "engine/whole_lines.h"
#include "optim/adamw.h"

using namespace belay;
using Json = nlohmann::ordered_json;

namespace {

// A field of /proc/self/status in bytes (VmRSS, VmHWM), or -1 when unavailable.
double status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) * 1024.0;
  return -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  belay::print_whole_lines();  // every line in one write()
  DType dtype = DType::BF16;
  bool low_grads = false;
  int64_t n = 4096;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) dtype = parse_dtype(argv[++i]);
    else if (a == "--grads" && i + 1 < argc) low_grads = std::string(argv[++i]) == "low";
    else if (a == "--in" && i + 1 < argc) n = std::stoll(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::cerr << "usage: belay_bench_memory --dtype fp32|bf16|fp16 --grads fp32|low [--in N] --json FILE\n";
      return 2;
    }
  }
  if (low_grads && dtype == DType::F32) {
    std::cerr << "belay_bench_memory: --grads low needs --dtype bf16 or fp16\n";
    return 2;
  }
  const int64_t batch = 256;
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const double rss_start = status_bytes("VmRSS");
  Rng rng(1);
  Tensor x = Tensor::empty(Shape{batch, n}), y = Tensor::empty(Shape{batch, n});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = rng.normal();
  for (int64_t i = 0; i < y.numel(); ++i) y.data_as<float>()[i] = 0.5f * rng.normal();
  const size_t in_use_before_model = alloc.stats().bytes_in_use;

  Linear model(n, n, rng);
  model.set_working_dtype(dtype);
  model.set_grad_dtype(low_grads ? dtype : DType::F32);
  AdamWOptions ao;
  ao.lr = 1e-4f;
  AdamW opt(model.parameters(), ao);
  GradScalerOptions so;
  so.enabled = default_scaler_enabled(dtype);
  GradScaler scaler(Device::cpu(), so);
  SafeStepOptions sso;
  sso.max_norm = 1.0f;
  SafeStep step(opt, scaler, LrSchedule::constant(ao.lr), sso);
  auto run = [&] {
    return step.run([&](int) {
      Autocast autocast(dtype, dtype != DType::F32);
      return mse_loss(model(Var(x)), y);
    });
  };
  float first = 0.0f, last = 0.0f;
  for (int s = 0; s < 3; ++s) {
    const StepRow row = run();
    if (s == 0) first = row.loss;
    last = row.loss;
  }
  const AllocatorStats st = alloc.stats();  // after a step: the gradients are still held
  if (!std::isfinite(last) || !(last < first)) {
    std::cerr << "belay_bench_memory: check failed: loss " << first << " -> " << last << "\n";
    return 1;
  }
  const double params = static_cast<double>(model.parameter_count());
  const double state = static_cast<double>(st.bytes_in_use - in_use_before_model);
  const double by_design = 4.0 /*master*/ + (dtype == DType::F32 ? 0.0 : 2.0) /*working*/ + 8.0 /*m, v*/ +
                           (low_grads ? 2.0 : 4.0) /*grad*/;
  const double predicted = rss_start + static_cast<double>(st.peak_bytes_in_use);
  const double held = rss_start + static_cast<double>(st.bytes_in_use + st.bytes_cached);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double hwm = status_bytes("VmHWM");
  const double peak_rss = hwm > 0 ? hwm : static_cast<double>(ru.ru_maxrss) * 1024.0;
  Json doc{{"model", "linear" + std::to_string(n)},
           {"batch", batch},
           {"dtype", dtype_name(dtype)},
           {"grads", low_grads ? dtype_name(dtype) : "fp32"},
           {"params", params},
           {"state_bytes", state},
           {"state_bytes_per_param", state / params},
           {"state_bytes_per_param_by_design", by_design},
           {"rss_start_bytes", rss_start},
           {"allocator_peak_in_use_bytes", static_cast<double>(st.peak_bytes_in_use)},
           {"allocator_held_bytes", static_cast<double>(st.bytes_in_use + st.bytes_cached)},
           {"activations_and_scratch_at_peak_bytes",
            static_cast<double>(st.peak_bytes_in_use) - static_cast<double>(in_use_before_model) - state},
           {"predicted_peak_rss_bytes", predicted},
           {"held_rss_bytes", held},
           {"peak_rss_bytes", peak_rss},
           {"peak_rss_over_predicted", peak_rss / predicted},
           {"first_loss", first},
           {"last_loss", last}};
  if (json_path.empty())
    std::cout << doc.dump(2) << "\n";
  else
    std::ofstream(json_path) << doc.dump(2) << "\n";
  return 0;
}
