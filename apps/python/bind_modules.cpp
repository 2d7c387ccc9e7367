// belay.Module (parameters, state dict, working dtype), Linear, Mlp, Embedding, LayerNorm and the GPT.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "amp/autocast.h"
#include "autograd/gpt.h"
#include "autograd/modules.h"
#include "bindings.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// A Module subclassed in Python (belay.Module, belay/__init__.py): forward and
// named_parameters are its Python methods. C++ calls them (a checkpoint asks for the
// parameters, perhaps while a step holds no GIL) through these, which take the GIL.
class PyModule : public Module {
 public:
  using Named = std::vector<std::pair<std::string, Var>>;
  Var forward(const Var& x) override { PYBIND11_OVERRIDE_PURE(Var, Module, forward, x); }
  Named named_parameters() const override { PYBIND11_OVERRIDE_PURE(Named, Module, named_parameters, ); }
};

// model(...): the forward in the model's mode. Evaluation records no graph and runs a model
// whose working copies are FP16/BF16 under autocast in that dtype (unless the caller set
// one), so an FP16 model serves predictions without `with belay.autocast(...)`. A model
// written in Python gets its arguments as given; a C++ one (Linear, Mlp) takes one input and
// runs without the GIL, as the step does.
py::object call_module(py::object self, py::args args, py::kwargs kwargs) {
  Module& mod = self.cast<Module&>();
  const std::vector<Var> params = mod.parameters();
  for (const Var& p : params) refresh_working_copy(p);
  std::unique_ptr<NoGrad> no_grad;
  std::unique_ptr<Autocast> autocast;
  if (!mod.training) {
    no_grad = std::make_unique<NoGrad>();
    // The first low-precision parameter names the dtype: a GPT keeps its embeddings and
    // LayerNorms (its first parameters) in FP32 while its Linears read FP16/BF16 copies.
    DType working = DType::F32;
    for (const Var& p : params)
      if (p.dtype() != DType::F32) {
        working = p.dtype();
        break;
      }
    if (working != DType::F32 && !autocast_policy().enabled) autocast = std::make_unique<Autocast>(working);
  }
  if (dynamic_cast<PyModule*>(&mod)) return self.attr("forward")(*args, **kwargs);
  if (args.size() != 1 || !kwargs.empty())
    throw py::type_error(type_name(self) + "(x) takes one input, got " + std::to_string(args.size()) +
                         " positional and " + std::to_string(kwargs.size()) + " keyword arguments");
  const Var x = as_var_on(args[0], params.empty() ? Device::cpu() : params[0].device());
  Var y;
  {
    py::gil_scoped_release nogil;
    y = mod(x);
  }
  return py::cast(y);
}

py::object set_training(py::object self, bool mode) {
  self.cast<Module&>().training = mode;
  return self;
}

// The GELU form by the name `belay train --gelu` takes.
Activation gelu_named(const std::string& name) {
  if (name == "erf") return Activation::Gelu;
  if (name == "tanh") return Activation::GeluTanh;
  throw UsageError("gelu must be 'erf' or 'tanh', got '" + name + "'");
}
const char* gelu_name(Activation a) { return a == Activation::GeluTanh ? "tanh" : "erf"; }

// belay.GptConfig and belay.Gpt (autograd/gpt.h), as nanoGPT's GPTConfig and GPT: the sizes,
// then a model from them and a seed (the same seed gives `belay train --model gpt --seed`'s init).
void bind_gpt(py::module_& m) {
  py::class_<GptConfig>(m, "GptConfig",
                        "The GPT's sizes: vocab, context, width, layers, heads, and the MLP's gelu ('erf' or 'tanh')")
      .def(py::init([](int64_t vocab, int64_t context, int64_t width, int64_t layers, int64_t heads,
                       const std::string& gelu) {
        GptConfig c{vocab, context, width, layers, heads};
        c.gelu = gelu_named(gelu);
        return c;
      }), py::arg("vocab") = 256, py::arg("context") = 64, py::arg("width") = 128, py::arg("layers") = 2,
         py::arg("heads") = 4, py::arg("gelu") = "erf")
      .def_readwrite("vocab", &GptConfig::vocab)
      .def_readwrite("context", &GptConfig::context)
      .def_readwrite("width", &GptConfig::width)
      .def_readwrite("layers", &GptConfig::layers)
      .def_readwrite("heads", &GptConfig::heads)
      .def_property("gelu", [](const GptConfig& c) { return gelu_name(c.gelu); },
                    [](GptConfig& c, const std::string& name) { c.gelu = gelu_named(name); },
                    "the MLP's GELU: 'erf' (PyTorch's default) or 'tanh' (GPT-2's gelu_new)")
      .def_property_readonly("parameter_count", [](const GptConfig& c) { return static_cast<int64_t>(c.parameter_count()); })
      .def("__repr__", [](const GptConfig& c) {
        return "GptConfig(vocab=" + std::to_string(c.vocab) + ", context=" + std::to_string(c.context) + ", width=" +
               std::to_string(c.width) + ", layers=" + std::to_string(c.layers) + ", heads=" + std::to_string(c.heads) + ", gelu='" + gelu_name(c.gelu) + "')";
      });
  auto make = [](const GptConfig& c, uint64_t seed, const std::string& device) {
    c.validate();  // before any allocation: a bad size is a UsageError naming it
    Rng rng(seed);
    AllocationPurpose purpose("the parameters of a GPT of " + std::to_string(static_cast<int64_t>(c.parameter_count())) +
                              " parameters");
    return std::make_unique<Gpt>(c, rng, to_device(device));
  };
  py::class_<Gpt, Module>(m, "Gpt",
                          "A decoder-only transformer (autograd/gpt.h): pre-LayerNorm blocks of causal attention and a "
                          "GELU MLP, tied head, GPT-2's init from `seed`. model(ids [B, T] ints) -> logits [B T, vocab]")
      .def(py::init([make](const GptConfig& c, uint64_t seed, const std::string& device) { return make(c, seed, device); }),
           py::arg("config"), py::arg("seed") = 0, py::arg("device") = "cpu")
      .def(py::init([make](int64_t vocab, int64_t context, int64_t width, int64_t layers, int64_t heads,
                           const std::string& gelu, uint64_t seed, const std::string& device) {
        GptConfig c{vocab, context, width, layers, heads};
        c.gelu = gelu_named(gelu);
        return make(c, seed, device);
      }), py::kw_only(), py::arg("vocab") = 256, py::arg("context") = 64, py::arg("width") = 128, py::arg("layers") = 2,
         py::arg("heads") = 4, py::arg("gelu") = "erf", py::arg("seed") = 0, py::arg("device") = "cpu")
      .def_property_readonly("config", [](const Gpt& g) { return g.config(); },
                             "The sizes (a copy: changing it changes no model)");
}

}  // namespace

void bind_modules(py::module_& m) {
  // ---- modules
  py::class_<Module, PyModule>(m, "Module",
                               "The base of models: belay.Module (belay/__init__.py) is the one to subclass in Python")
      .def(py::init<>())
      .def("__call__", &call_module)
      .def("forward", [](Module& mod, py::handle x) {
        for (const Var& p : mod.parameters()) refresh_working_copy(p);
        const Var in = as_var(x);
        py::gil_scoped_release nogil;
        return mod.forward(in);
      })
      .def_readwrite("training", &Module::training, "True after train() (the start), False after eval()")
      .def("train", &set_training, py::arg("mode") = true, "Training mode (mode=False: eval()); returns the module")
      .def("eval", [](py::object self) { return set_training(self, false); },
           "Evaluation mode: model(x) records no graph and runs an FP16/BF16 model under autocast in its dtype; "
           "returns the module")
      .def("parameters", &Module::parameters)
      .def("named_parameters", &Module::named_parameters)
      .def_property_readonly("parameter_count", &Module::parameter_count)
      .def("zero_grad", &Module::zero_grad, py::arg("set_to_none") = true)
      .def("set_working_dtype", [](Module& mod, py::handle d) { mod.set_working_dtype(to_dtype(d)); },
           "Forward reads an FP16/BF16 copy of the FP32 masters (fp32: the masters themselves)")
      .def("set_grad_dtype", [](Module& mod, py::handle d) { mod.set_grad_dtype(to_dtype(d)); })
      .def("state_dict", [](const Module& mod) {
        py::dict out;
        for (auto& [name, p] : mod.named_parameters())
          out[py::str(name)] = to_numpy(p.master().clone(), py::none()).attr("copy")();
        return out;
      }, "The FP32 masters as NumPy arrays (copies), under the state-dict names")
      .def("load_state_dict", [](Module& mod, const py::dict& state) {
        // Everything checked before anything is written, as load_checkpoint does.
        std::vector<std::pair<Var, Tensor>> plan;
        for (auto& [name, p] : mod.named_parameters()) {
          if (!state.contains(name)) throw UsageError("load_state_dict: no '" + name + "' in the state dict");
          Tensor t = to_tensor(state[py::str(name)], DType::F32, p.device(), false);
          if (t.shape() != p.shape())
            throw UsageError("load_state_dict: '" + name + "' has shape " + t.shape().str() + ", the model needs " +
                             p.shape().str());
          plan.push_back({p, t});
        }
        if (plan.size() != state.size()) throw UsageError("load_state_dict: the state dict has names the model lacks");
        for (auto& [p, t] : plan) {
          Tensor master = p.master();  // shares the master's storage
          master.copy_from(t);
          p.set_working_dtype(p.dtype());  // the working copy: the new master, rounded
        }
      }, py::arg("state"));
  py::class_<Linear, Module>(m, "Linear")
      .def(py::init([](int64_t in, int64_t out, uint64_t seed, bool bias, const std::string& device) {
        Rng rng(seed);
        AllocationPurpose purpose("the parameters of Linear(" + std::to_string(in) + ", " + std::to_string(out) + ")");
        return std::make_unique<Linear>(in, out, rng, bias, to_device(device));
      }), py::arg("in_features"), py::arg("out_features"), py::arg("seed") = 0, py::arg("bias") = true,
         py::arg("device") = "cpu", "PyTorch's init (uniform in +-1/sqrt(in)) from a seeded generator")
      .def_readonly("weight", &Linear::weight)
      .def_property_readonly("bias", [](const Linear& l) { return l.bias.defined() ? py::cast(l.bias) : py::none(); });
  py::class_<Embedding, Module>(m, "Embedding")
      .def(py::init([](int64_t num, int64_t dim, uint64_t seed, const std::string& device) {
        Rng rng(seed);
        AllocationPurpose purpose("the parameters of Embedding(" + std::to_string(num) + ", " + std::to_string(dim) + ")");
        return std::make_unique<Embedding>(num, dim, rng, to_device(device));
      }), py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("seed") = 0, py::arg("device") = "cpu",
         "A table of vectors, GPT-2's init (normal, std 0.02) from a seeded generator; model(ids) gathers rows")
      .def_readonly("weight", &Embedding::weight);
  py::class_<LayerNorm, Module>(m, "LayerNorm")
      .def(py::init([](int64_t dim, float eps, const std::string& device) {
        return std::make_unique<LayerNorm>(dim, eps, to_device(device));
      }), py::arg("normalized_shape"), py::arg("eps") = 1e-5f, py::arg("device") = "cpu",
         "LayerNorm over the last dim (of size normalized_shape), weight 1 and bias 0 to start")
      .def_readonly("weight", &LayerNorm::weight)
      .def_readonly("bias", &LayerNorm::bias)
      .def_readonly("eps", &LayerNorm::eps);
  py::class_<Mlp, Module>(m, "Mlp")
      .def(py::init([](int64_t in, int64_t hidden, int64_t out, int layers, const std::string& act, uint64_t seed,
                       const std::string& device) {
        if (act != "gelu" && act != "relu") throw UsageError("Mlp: unknown activation '" + act + "': use gelu or relu");
        Rng rng(seed);
        AllocationPurpose purpose("the parameters of Mlp(" + std::to_string(in) + ", " + std::to_string(hidden) + ", " +
                                  std::to_string(out) + ")");
        return std::make_unique<Mlp>(in, hidden, out, rng, layers, act == "gelu" ? Activation::Gelu : Activation::Relu,
                                     to_device(device));
      }), py::arg("in_features"), py::arg("hidden"), py::arg("out_features"), py::arg("layers") = 2,
         py::arg("activation") = "gelu", py::arg("seed") = 0, py::arg("device") = "cpu");
  bind_gpt(m);
}

}  // namespace belay::python
