// The conversions the binding groups share (bindings.h), the exceptions, and the module:
// PYBIND11_MODULE is the list of groups.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "apps/run/train_options.h"
#include "autograd/modules.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {
// The StepRow named tuple, created at import (PYBIND11_MODULE). Never released: a static
// py::object would be destroyed after the interpreter is gone.
py::object& g_step_row_type = *new py::object();
PyObject* g_error = nullptr;
PyObject* g_usage_error = nullptr;

// Parameters whose FP32 master Python has been handed (Var.master). Python may have written it
// since (through .numpy(), fill, set_element), and an FP16/BF16 working copy, refreshed only by
// the optimizer's pass, would not show it: the forward would read the old weights until the
// next step. So the working copy of such a parameter is refreshed from its master before every
// forward that reads it (one cast pass, which autocast costs PyTorch every forward anyway), and
// a forward sees what the master holds, as model.weight does in PyTorch. Touched with the GIL.
std::unordered_map<const Node*, std::weak_ptr<Node>>& masters_handed_out() {
  static auto* handed = new std::unordered_map<const Node*, std::weak_ptr<Node>>();
  return *handed;
}

}  // namespace

// A message as Python should read it: the library's errors name the CLI's options
// ("--new-experiment"), which are keywords here ("new_experiment=True").
std::string python_message(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    // An option starts a word: "--dtype", "(--unfused)"; not the middle of a path ("run--a.csv").
    const bool word_start = i == 0 || std::string(" ('\"`").find(text[i - 1]) != std::string::npos;
    const bool option = word_start && text.compare(i, 2, "--") == 0 && i + 2 < text.size() &&
                        std::islower(static_cast<unsigned char>(text[i + 2]));
    if (!option) {
      out += text[i++];
      continue;
    }
    size_t j = i + 2;
    while (j < text.size() && (std::islower(static_cast<unsigned char>(text[j])) ||
                               std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '-'))
      ++j;
    std::string name = text.substr(i + 2, j - i - 2);
    // belay train's options by their keywords (`in` is a Python keyword: in_features), flags as
    // name=True; other words with '-' as '_'.
    const TrainOption* row = option_named(name);
    if (row) name = keyword_of(*row);
    for (char& c : name)
      if (c == '-') c = '_';
    out += row && is_flag(*row) ? name + "=True" : name;
    i = j;
  }
  return out;
}

PyObject* error_type() { return g_error; }
PyObject* usage_error_type() { return g_usage_error; }

py::object to_py(const StepRow& r) {
  return g_step_row_type(r.step, r.lr, r.grad_l2_pre_clip, r.grad_l2_post_clip, r.loss, r.skipped, r.skip_reason,
                         r.scaler_scale);
}

// A row from Python: anything with the eight attributes (a StepRow, or a user's own record).
StepRow from_py(py::handle o) {
  StepRow r;
  r.step = o.attr("step").cast<int64_t>();
  r.lr = o.attr("lr").cast<float>();
  r.grad_l2_pre_clip = o.attr("grad_l2_pre_clip").cast<float>();
  r.grad_l2_post_clip = o.attr("grad_l2_post_clip").cast<float>();
  r.loss = o.attr("loss").cast<float>();
  r.skipped = o.attr("skipped").cast<bool>();
  r.skip_reason = o.attr("skip_reason").cast<std::string>();
  r.scaler_scale = o.attr("scaler_scale").cast<float>();
  return r;
}

Device to_device(const std::string& name) { return parse_device(name); }

const Tensor& hand_out_master(const Var& v) {
  masters_handed_out()[v.node()] = v.node_ptr();
  return v.master();
}

void refresh_working_copy(const Var& p) {
  if (!p.is_parameter()) return;
  auto& handed = masters_handed_out();
  const auto it = handed.find(p.node());
  if (it == handed.end()) return;
  if (it->second.lock().get() != p.node()) {  // another node, at the address of one gone
    handed.erase(it);
    return;
  }
  Tensor& working = p.node()->value;
  if (working.data() != p.master().data()) working.copy_from(p.master());  // rounds as the optimizer's refresh
}

// An op's input: a Var as it is; a Tensor or anything array-like as a constant (no grad).
Var as_var(py::handle o) {
  if (py::isinstance<Var>(o)) {
    Var v = o.cast<Var>();
    refresh_working_copy(v);
    return v;
  }
  return Var(to_tensor(o, std::nullopt, Device::cpu(), false));
}
// A Var's device decides where a constant goes (a model on the GPU, data from NumPy).
Var as_var_on(py::handle o, Device device) {
  if (py::isinstance<Var>(o)) return as_var(o);
  return Var(to_tensor(o, std::nullopt, device, false));
}
Tensor as_target(py::handle o, Device device) { return to_tensor(o, DType::F32, device, false); }

std::string type_name(py::handle o) {
  const py::handle type = py::type::of(o);
  const std::string module = py::str(type.attr("__module__"));
  const std::string name = py::str(type.attr("__qualname__"));
  if (module == "builtins") return name;
  return (module.rfind("belay", 0) == 0 ? "belay" : module) + "." + name;
}

std::vector<Var> as_params(py::handle o, const std::string& what) {
  if (py::isinstance<Module>(o)) return o.cast<Module&>().parameters();
  if (py::isinstance<Var>(o))
    throw py::type_error(what + " must be a belay.Module or a list of parameters, got one belay.Var: put it in a list");
  if (!py::hasattr(o, "__iter__") || py::isinstance<py::str>(o) || py::isinstance<py::dict>(o))
    throw py::type_error(what + " must be a belay.Module or a list of parameters (belay.Var), got " + type_name(o));
  std::vector<Var> out;
  size_t i = 0;
  for (py::handle item : o) {
    if (!py::isinstance<Var>(item))
      throw py::type_error(what + "[" + std::to_string(i) + "] is a " + type_name(item) +
                           ", not a parameter (belay.Var from belay.parameter or a module)");
    out.push_back(item.cast<Var>());
    ++i;
  }
  return out;
}

void bind_errors(py::module_& m) {
  // UsageError is also a ValueError (a bad argument, shape or dtype).
  g_error = PyErr_NewException("belay.Error", PyExc_RuntimeError, nullptr);
  g_usage_error = PyErr_NewException(
      "belay.UsageError", py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)).release().ptr(), nullptr);
  m.attr("Error") = py::handle(g_error);
  m.attr("UsageError") = py::handle(g_usage_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UsageError& e) {
      PyErr_SetString(g_usage_error, python_message(e.what()).c_str());
    } catch (const Error& e) {
      PyErr_SetString(g_error, python_message(e.what()).c_str());
    } catch (const std::bad_alloc&) {
      // A host container that the caching allocator does not serve (its own failures are a
      // belay::Error with the size): as PyTorch reports an allocation, a RuntimeError.
      PyErr_SetString(g_error, "cannot allocate memory: a host allocation failed (std::bad_alloc); use smaller sizes");
    } catch (const std::length_error& e) {
      PyErr_SetString(g_error, (std::string("cannot allocate memory: ") + e.what() + "; use smaller sizes").c_str());
    }
  });
}

void bind_step_row(py::module_& m) {
  g_step_row_type = py::module_::import("collections").attr("namedtuple")(
      "StepRow", py::make_tuple("step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
                                "skip_reason", "scaler_scale"));
  g_step_row_type.attr("__module__") = "belay";
  m.attr("StepRow") = g_step_row_type;
}

}  // namespace belay::python
