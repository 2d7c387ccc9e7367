// Modules: parameters with names (the state dict) and a forward. Linear, a small MLP, and the
// transformer's Embedding and LayerNorm (the GPT built from them: autograd/gpt.h).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "engine/backend.h"
#include "engine/random.h"

namespace belay {

class Module {
 public:
  virtual ~Module() = default;
  virtual Var forward(const Var& x) = 0;
  virtual std::vector<std::pair<std::string, Var>> named_parameters() const = 0;

  Var operator()(const Var& x) { return forward(x); }
  std::vector<Var> parameters() const;
  int64_t parameter_count() const;
  void zero_grad(bool set_to_none = true);
  // FP16/BF16 working copies for the forward (FP32 shares the masters), and the dtype
  // weight gradients accumulate in (FP32 by default; the compute dtype halves the memory).
  virtual void set_working_dtype(DType dtype);
  void set_grad_dtype(DType dtype);

  // Training or evaluation (PyTorch's module.train()/eval()). The modules here behave the same
  // either way (no dropout, no batch norm); the Python module's model(x) reads it: in eval
  // mode it records no graph and runs an FP16/BF16 model under autocast in its dtype.
  bool training = true;
};

class Linear : public Module {
 public:
  // PyTorch's default init: weight and bias uniform in +-1/sqrt(in_features); with
  // init_std > 0, GPT-2's: weight normal(0, init_std), bias 0.
  Linear(int64_t in_features, int64_t out_features, Rng& rng, bool bias = true, Device device = Device::cpu(),
         const std::string& prefix = "", float init_std = 0.0f);
  Var forward(const Var& x) override;
  std::vector<std::pair<std::string, Var>> named_parameters() const override;

  Var weight;  // [out, in]
  Var bias;    // [out], undefined without bias

 private:
  std::string prefix_;
  std::string path_;  // the module path its ops are recorded under: the prefix without its '.'
};

// A table of `num` vectors of `dim` (token or position embeddings), initialised as GPT-2's:
// normal with standard deviation 0.02. forward(ids): ids is a Var holding row indices as FP32
// values (never differentiated); the result is [ids..., dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Rng& rng, Device device = Device::cpu(), const std::string& prefix = "");
  Var forward(const Var& ids) override;
  std::vector<std::pair<std::string, Var>> named_parameters() const override;

  Var weight;  // [num, dim]

 private:
  std::string prefix_, path_;
};

// LayerNorm over the last dim, weight 1 and bias 0 to start (PyTorch's and GPT-2's).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, Device device = Device::cpu(), const std::string& prefix = "");
  Var forward(const Var& x) override;
  std::vector<std::pair<std::string, Var>> named_parameters() const override;

  Var weight, bias;  // [dim] each
  float eps;

 private:
  std::string prefix_, path_;
};

// in -> hidden -> (activation) -> ... -> out; `layers` linear layers in all (>= 2).
class Mlp : public Module {
 public:
  Mlp(int64_t in_features, int64_t hidden, int64_t out_features, Rng& rng, int layers = 2,
      Activation act = Activation::Gelu, Device device = Device::cpu());
  Var forward(const Var& x) override;
  std::vector<std::pair<std::string, Var>> named_parameters() const override;

 private:
  std::vector<Linear> layers_;
  std::vector<std::string> act_paths_;  // "layers.0.act": the activation after hidden layer 0
  Activation act_;
};

}  // namespace belay
