// LR schedules and the optimizers: AdamW and SGD.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace belay::python {

namespace {

// PyTorch's param groups: a list (or tuple) of dicts.
bool is_group_list(py::handle params) {
  if (!py::isinstance<py::list>(params) && !py::isinstance<py::tuple>(params)) return false;
  const auto seq = py::reinterpret_borrow<py::sequence>(params);
  return seq.size() > 0 && py::isinstance<py::dict>(seq[0]);
}

// Each group's dict, its keys checked against `known`; calls read(key, value, what) for
// every key but 'params'. The options start as the optimizer's (the keywords).
template <class Group, class Options, class Read>
std::vector<Group> read_groups(py::handle params, const Options& defaults, const char* optimizer, const char* known,
                               Read read) {
  std::vector<Group> out;
  size_t g = 0;
  for (py::handle item : params) {
    const std::string where = std::string(optimizer) + ": parameter group " + std::to_string(g);
    if (!py::isinstance<py::dict>(item))
      throw py::type_error(where + " is a " + type_name(item) + ": give every group as a dict, or no group at all");
    const auto d = py::reinterpret_borrow<py::dict>(item);
    if (!d.contains("params")) throw UsageError(where + " has no 'params'");
    Group group{as_params(d["params"], where + " 'params'"), defaults};
    for (auto [k, v] : d) {
      const std::string key = cast_arg<std::string>(k, where + ": a key", "a str");
      if (key == "params") continue;
      if (!read(group.options, key, v, where + " '" + key + "'"))
        throw UsageError(where + " has the unknown key '" + key + "'; " + optimizer + " knows " + known);
    }
    out.push_back(std::move(group));
    ++g;
  }
  return out;
}

std::vector<AdamWGroup> adamw_groups(py::handle params, const AdamWOptions& defaults) {
  return read_groups<AdamWGroup>(params, defaults, "AdamW", "params, lr, betas, eps, weight_decay, decay_1d",
                                 [](AdamWOptions& o, const std::string& key, py::handle v, const std::string& what) {
    if (key == "lr") o.lr = cast_arg<float>(v, what, "a number");
    else if (key == "eps") o.eps = cast_arg<float>(v, what, "a number");
    else if (key == "weight_decay") o.weight_decay = cast_arg<float>(v, what, "a number");
    else if (key == "decay_1d") o.decay_1d = cast_arg<bool>(v, what, "a bool");
    else if (key == "betas") {
      const auto b = cast_arg<std::pair<float, float>>(v, what, "a pair of numbers");
      o.beta1 = b.first;
      o.beta2 = b.second;
    } else return false;
    return true;
  });
}

std::vector<SgdGroup> sgd_groups(py::handle params, const SgdOptions& defaults) {
  return read_groups<SgdGroup>(params, defaults, "SGD", "params, lr, momentum, weight_decay, decay_1d",
                               [](SgdOptions& o, const std::string& key, py::handle v, const std::string& what) {
    if (key == "lr") o.lr = cast_arg<float>(v, what, "a number");
    else if (key == "momentum") o.momentum = cast_arg<float>(v, what, "a number");
    else if (key == "weight_decay") o.weight_decay = cast_arg<float>(v, what, "a number");
    else if (key == "decay_1d") o.decay_1d = cast_arg<bool>(v, what, "a bool");
    else return false;
    return true;
  });
}

// The keys every optimizer's group shows: its parameters and its LR now.
py::dict group_dict(const Optimizer& o, size_t g) {
  py::list params;
  for (size_t i = o.group_begin(g); i < o.group_begin(g + 1); ++i) params.append(o.params()[i]);
  py::dict d;
  d["params"] = params;
  d["lr"] = o.lr_tensor(g).item();
  return d;
}

}  // namespace


void bind_optimizers(py::module_& m) {
  // ---- LR schedules and optimizers
  py::class_<LrSchedule>(m, "LrSchedule", "The LR as a function of the number of APPLIED steps")
      .def_static("constant", &LrSchedule::constant, py::arg("lr"))
      .def_static("warmup_cosine", &LrSchedule::warmup_cosine, py::arg("peak_lr"), py::arg("warmup_steps"),
                  py::arg("total_steps"), py::arg("min_lr") = 0.0f)
      .def("lr_at", &LrSchedule::lr_at, py::arg("applied_steps"))
      .def_readonly("peak_lr", &LrSchedule::peak_lr)
      .def_readonly("warmup_steps", &LrSchedule::warmup_steps)
      .def_readonly("total_steps", &LrSchedule::total_steps)
      .def_readonly("min_lr", &LrSchedule::min_lr);
  py::class_<Optimizer>(m, "Optimizer")
      .def("step", [](Optimizer& o) { py::gil_scoped_release nogil; o.step(); }, "A plain step: no scaling, no clipping")
      .def("zero_grad", &Optimizer::zero_grad, py::arg("set_to_none") = true)
      .def_property_readonly("params", &Optimizer::params)
      .def_property_readonly("name", &Optimizer::name)
      .def_property_readonly("step_count", &Optimizer::step_count, "Applied steps (a host read)")
      .def("set_schedule", &Optimizer::set_schedule)
      .def("set_lr", &Optimizer::set_lr)
      .def_property_readonly("schedule", &Optimizer::schedule)
      .def_property_readonly("lr", [](const Optimizer& o) { return o.lr_tensor().item(); },
                             "The LR the last step used or would have used")
      .def("grads", [](const Optimizer& o) {
        std::vector<Tensor> out;
        for (const Tensor* g : o.grads()) out.push_back(*g);
        return out;
      }, "The gradients the next step reads (tensors sharing their memory)")
      .def("state_tensors", [](Optimizer& o) {
        py::dict out;
        for (auto& [name, t] : o.state_tensors()) out[py::str(name)] = *t;
        return out;
      }, "The FP32 state (moments, momentum buffers) by checkpoint name");
  py::class_<AdamW, Optimizer>(m, "AdamW")
      .def(py::init([](py::handle params, float lr, std::pair<float, float> betas, float eps, float wd, bool decay_1d) {
        const AdamWOptions defaults{lr, betas.first, betas.second, eps, wd, decay_1d};
        if (!is_group_list(params)) return std::make_unique<AdamW>(as_params(params, "AdamW: params"), defaults);
        return std::make_unique<AdamW>(adamw_groups(params, defaults), defaults);
      }), py::arg("params"), py::arg("lr") = 1e-3f, py::arg("betas") = std::make_pair(0.9f, 0.999f),
         py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.01f, py::arg("decay_1d") = false,
         "AdamW over a module's parameters, a list of parameters, or parameter groups as in PyTorch: a list of "
         "dicts {'params': [...], 'lr': ..., 'weight_decay': ..., 'betas': ..., 'eps': ..., 'decay_1d': ...}, a "
         "missing key taking the keyword's value. A schedule (or set_lr) scales each group's lr by group lr / lr. "
         "1-D parameters get no decay unless decay_1d")
      .def_property_readonly("param_groups", [](const AdamW& o) {
        py::list out;
        for (size_t g = 0; g < o.group_count(); ++g) {
          const AdamWOptions& x = o.group_options(g);
          py::dict d = group_dict(o, g);
          d["betas"] = py::make_tuple(x.beta1, x.beta2);
          d["eps"] = x.eps;
          d["weight_decay"] = x.weight_decay;
          d["decay_1d"] = x.decay_1d;
          out.append(d);
        }
        return out;
      }, "The groups as dicts (a snapshot: 'lr' is the group's LR now; change LRs with set_lr or set_schedule)");
  py::class_<Sgd, Optimizer>(m, "SGD")
      .def(py::init([](py::handle params, float lr, float momentum, float wd, bool decay_1d) {
        const SgdOptions defaults{lr, momentum, wd, decay_1d};
        if (!is_group_list(params)) return std::make_unique<Sgd>(as_params(params, "SGD: params"), defaults);
        return std::make_unique<Sgd>(sgd_groups(params, defaults), defaults);
      }), py::arg("params"), py::arg("lr") = 1e-2f, py::arg("momentum") = 0.9f, py::arg("weight_decay") = 0.0f,
         py::arg("decay_1d") = false,
         "SGD with momentum over a module's parameters, a list of parameters, or parameter groups (dicts with "
         "'params' and any of 'lr', 'momentum', 'weight_decay', 'decay_1d'), as AdamW")
      .def_property_readonly("param_groups", [](const Sgd& o) {
        py::list out;
        for (size_t g = 0; g < o.group_count(); ++g) {
          const SgdOptions& x = o.group_options(g);
          py::dict d = group_dict(o, g);
          d["momentum"] = x.momentum;
          d["weight_decay"] = x.weight_decay;
          d["decay_1d"] = x.decay_1d;
          out.append(d);
        }
        return out;
      }, "The groups as dicts (a snapshot, as AdamW.param_groups)");
}

}  // namespace belay::python
