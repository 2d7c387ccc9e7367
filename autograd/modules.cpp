#include "autograd/modules.h"

#include <cmath>

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

std::vector<Var> Module::parameters() const {
  std::vector<Var> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Var& p : parameters()) n += p.value().numel();
  return n;
}

void Module::zero_grad(bool set_to_none) {
  for (Var& p : parameters()) p.zero_grad(set_to_none);
}

void Module::set_working_dtype(DType dtype) {
  for (Var& p : parameters()) p.set_working_dtype(dtype);
}

void Module::set_grad_dtype(DType dtype) {
  for (Var& p : parameters()) {
    p.zero_grad(true);
    p.set_grad_dtype(dtype);
  }
}

// Drawn straight into the tensor's own storage: a size the allocator refuses is a belay::Error
// saying how many bytes, before any value is drawn (no host vector to fail first).
static Tensor uniform_tensor(const Shape& shape, float bound, Rng& rng, Device device) {
  Tensor host = Tensor::empty(shape, DType::F32, Device::cpu());
  float* v = host.data_as<float>();
  for (int64_t i = 0; i < host.numel(); ++i) v[i] = rng.uniform(-bound, bound);
  return device.is_cpu() ? host : host.to(device);
}

// Normal(0, std) values, drawn in order into the tensor's own storage (GPT-2's init).
static Tensor normal_tensor(const Shape& shape, float std, Rng& rng, Device device) {
  Tensor host = Tensor::empty(shape, DType::F32, Device::cpu());
  float* v = host.data_as<float>();
  for (int64_t i = 0; i < host.numel(); ++i) v[i] = std * rng.normal();
  return device.is_cpu() ? host : host.to(device);
}

Linear::Linear(int64_t in, int64_t out, Rng& rng, bool with_bias, Device device, const std::string& prefix,
               float init_std)
    : prefix_(prefix), path_(prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1)) {
  if (in <= 0 || out <= 0)
    throw UsageError("Linear: sizes must be positive, got in=" + std::to_string(in) + " out=" + std::to_string(out));
  // A weight whose size overflows is a UsageError from Shape, one the allocator cannot give an
  // Error naming the bytes (uniform_tensor allocates before it draws): never a hang or a crash.
  const Shape weight_shape{out, in};
  if (init_std > 0.0f) {
    weight = Var::parameter(normal_tensor(weight_shape, init_std, rng, device), prefix + "weight");
    if (with_bias) bias = Var::parameter(Tensor::zeros(Shape{out}, DType::F32, device), prefix + "bias");
    return;
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  weight = Var::parameter(uniform_tensor(weight_shape, bound, rng, device), prefix + "weight");
  if (with_bias) bias = Var::parameter(uniform_tensor(Shape{out}, bound, rng, device), prefix + "bias");
}

Var Linear::forward(const Var& x) {
  ModuleScope scope(path_.c_str());
  return linear(x, weight, bias);
}

std::vector<std::pair<std::string, Var>> Linear::named_parameters() const {
  // From the prefix, not the parameters' names: the Python module renames a parameter to its
  // attribute path (model.fc1.weight), which must not change this module's state-dict names.
  std::vector<std::pair<std::string, Var>> out{{prefix_ + "weight", weight}};
  if (bias.defined()) out.push_back({prefix_ + "bias", bias});
  return out;
}

static std::string path_of(const std::string& prefix) {
  return prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1);
}

Embedding::Embedding(int64_t num, int64_t dim, Rng& rng, Device device, const std::string& prefix)
    : prefix_(prefix), path_(path_of(prefix)) {
  if (num <= 0 || dim <= 0)
    throw UsageError("Embedding: sizes must be positive, got num=" + std::to_string(num) + " dim=" + std::to_string(dim));
  weight = Var::parameter(normal_tensor(Shape{num, dim}, 0.02f, rng, device), prefix + "weight");
}

Var Embedding::forward(const Var& ids) {
  if (!ids.defined()) throw UsageError("Embedding: undefined ids");
  ModuleScope scope(path_.c_str());
  return embedding(weight, ids.value());
}

std::vector<std::pair<std::string, Var>> Embedding::named_parameters() const { return {{prefix_ + "weight", weight}}; }

LayerNorm::LayerNorm(int64_t dim, float eps_, Device device, const std::string& prefix)
    : eps(eps_), prefix_(prefix), path_(path_of(prefix)) {
  if (dim <= 0) throw UsageError("LayerNorm: size must be positive, got " + std::to_string(dim));
  weight = Var::parameter(Tensor::full(Shape{dim}, 1.0f, DType::F32, device), prefix + "weight");
  bias = Var::parameter(Tensor::zeros(Shape{dim}, DType::F32, device), prefix + "bias");
}

Var LayerNorm::forward(const Var& x) {
  ModuleScope scope(path_.c_str());
  return layer_norm(x, weight, bias, eps);
}

std::vector<std::pair<std::string, Var>> LayerNorm::named_parameters() const {
  return {{prefix_ + "weight", weight}, {prefix_ + "bias", bias}};
}

Mlp::Mlp(int64_t in, int64_t hidden, int64_t out, Rng& rng, int layers, Activation act, Device device) : act_(act) {
  if (layers < 2) throw UsageError("Mlp: needs at least 2 layers, got " + std::to_string(layers));
  if (hidden <= 0) throw UsageError("Mlp: hidden size must be positive, got " + std::to_string(hidden));
  for (int i = 0; i < layers; ++i) {
    const int64_t fan_in = i == 0 ? in : hidden;
    const int64_t fan_out = i == layers - 1 ? out : hidden;
    layers_.emplace_back(fan_in, fan_out, rng, true, device, "layers." + std::to_string(i) + ".");
    act_paths_.push_back("layers." + std::to_string(i) + ".act");
  }
}

Var Mlp::forward(const Var& x) {
  Var h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i](h);
    if (i + 1 < layers_.size()) {
      ModuleScope scope(act_paths_[i].c_str());
      h = activation(h, act_);
    }
  }
  return h;
}

std::vector<std::pair<std::string, Var>> Mlp::named_parameters() const {
  std::vector<std::pair<std::string, Var>> out;
  for (const Linear& l : layers_)
    for (auto& p : l.named_parameters()) out.push_back(p);
  return out;
}

}  // namespace belay
