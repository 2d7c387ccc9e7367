// belay._belay: the Python bindings (pybind11). Wiring only: every number is computed by the
// same C++ the CLI runs. The package belay/ (belay/__init__.py) re-exports this module and
// adds the few conveniences written in Python (checkpoint save/resume of a whole run).
//
// Two rules hold across the bindings:
// - belay::UsageError becomes belay.UsageError (a ValueError), any other belay::Error
//   belay.Error (a RuntimeError), each with belay's one-line message.
// - SafeStep.run and train() release the GIL for the step; a Python loss function (or
//   after_backward hook) takes it back while it runs. An exception raised there propagates
//   unchanged, traceback and all, and the step is abandoned before anything was written
//   (SafeStep::enqueue drops the gradients and the scaler's checks).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <csignal>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "amp/grad_scaler.h"
#include "amp/safe_step.h"
#include "amp/step_log.h"
#include "numpy_interop.h"  // beside this file: the module builds against an installed belay too
#include "apps/run/trainer.h"
#include "autograd/modules.h"
#include "autograd/ops.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace py = pybind11;
using namespace belay;
using belay::python::to_dtype;
using belay::python::to_numpy;
using belay::python::to_tensor;

namespace {

// The StepRow named tuple, created at import (PYBIND11_MODULE). Never released: a static
// py::object would be destroyed after the interpreter is gone.
py::object& g_step_row_type = *new py::object();

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

ClipMode parse_clip_mode(const std::string& mode) {
  if (mode == "norm") return ClipMode::Norm;
  if (mode == "value") return ClipMode::Value;
  throw UsageError("unknown clip_mode '" + mode + "': use norm or value");
}

// A str, or a list of them (a repeatable CLI option).
std::vector<std::string> as_strings(py::handle value) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  return value.cast<std::vector<std::string>>();
}

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

std::vector<Var> as_params(py::handle o) {
  if (py::isinstance<Module>(o)) return o.cast<Module&>().parameters();
  return o.cast<std::vector<Var>>();
}

py::object optional_tensor(const Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

// Python's `with belay.autocast("fp16"):` over the C++ RAII guard; nested blocks stack.
class AutocastScope {
 public:
  AutocastScope(DType dtype, bool enabled, uint32_t fp32_ops) : dtype_(dtype), enabled_(enabled), fp32_ops_(fp32_ops) {}
  AutocastScope(const AutocastScope&) = delete;  // holds guards: pybind11 must not copy it
  AutocastScope& operator=(const AutocastScope&) = delete;
  void enter() { guards_.push_back(std::make_unique<Autocast>(dtype_, enabled_, fp32_ops_)); }
  void exit() {
    if (guards_.empty()) throw Error("autocast: __exit__ without __enter__");
    guards_.pop_back();
  }

 private:
  DType dtype_;
  bool enabled_;
  uint32_t fp32_ops_;
  std::vector<std::unique_ptr<Autocast>> guards_;
};

class NoGradScope {
 public:
  NoGradScope() = default;
  NoGradScope(const NoGradScope&) = delete;
  NoGradScope& operator=(const NoGradScope&) = delete;
  void enter() { guards_.push_back(std::make_unique<NoGrad>()); }
  void exit() { guards_.pop_back(); }

 private:
  std::vector<std::unique_ptr<NoGrad>> guards_;
};

// A Python callable as SafeStep's loss function: called with the GIL, and it must return a Var.
Var call_loss(const py::function& fn, int micro_batch) {
  py::gil_scoped_acquire gil;
  py::object out = fn(micro_batch);
  if (!py::isinstance<Var>(out))
    throw UsageError("SafeStep: the loss function returned a " + py::str(py::type::of(out)).cast<std::string>() +
                     ", not a belay.Var (the FP32 loss, e.g. belay.mse_loss(model(x), y))");
  return out.cast<Var>();
}

py::object run_step(SafeStep& step, const py::function& loss_fn) {
  StepRow row;
  {
    py::gil_scoped_release nogil;
    row = step.run([&](int k) { return call_loss(loss_fn, k); });
  }
  return to_py(row);
}

// belay.train(**options): the names are belay train's long options with '-' as '_'.
TrainConfig train_config(const py::kwargs& kw) {
  TrainConfig c;
  std::optional<bool> scaler;
  for (auto [key_h, value] : kw) {
    const std::string key = key_h.cast<std::string>();
    auto as_i64 = [&] { return value.cast<int64_t>(); };
    auto as_f = [&] { return value.cast<float>(); };
    auto as_s = [&] { return value.cast<std::string>(); };
    if (key == "model") c.model = as_s();
    else if (key == "in_features" || key == "in") c.in_features = as_i64();
    else if (key == "out_features" || key == "out") c.out_features = as_i64();
    else if (key == "hidden") c.hidden = as_i64();
    else if (key == "layers") c.layers = value.cast<int>();
    else if (key == "batch") c.batch = as_i64();
    else if (key == "micro_batch") c.micro_batch = as_i64();
    else if (key == "steps") c.steps = as_i64();
    else if (key == "seed") c.seed = value.cast<uint64_t>();
    else if (key == "optimizer") c.optimizer = as_s();
    else if (key == "lr") c.lr = as_f();
    else if (key == "weight_decay") c.weight_decay = as_f();
    else if (key == "momentum") c.momentum = as_f();
    else if (key == "schedule") c.schedule = as_s();
    else if (key == "warmup") c.warmup = as_i64();
    else if (key == "dtype") c.dtype = to_dtype(value);
    else if (key == "device") c.device = as_s();
    else if (key == "grad_dtype") {
      const std::string g = as_s();
      if (g != "fp32" && g != "compute") throw UsageError("unknown grad_dtype '" + g + "': use fp32 or compute");
      c.low_precision_grads = g == "compute";
    } else if (key == "clip") c.max_norm = as_f();
    else if (key == "unfused") c.fused = !value.cast<bool>();
    else if (key == "inject_inf") {
      if (py::isinstance<py::int_>(value)) c.inject_inf.insert(as_i64());
      else for (auto s : value) c.inject_inf.insert(s.cast<int64_t>());
    } else if (key == "spike") {
      for (auto [s, f] : value.cast<py::dict>()) c.spikes[s.cast<int64_t>()] = f.cast<float>();
    } else if (key == "csv") c.csv = as_s();
    else if (key == "scaler") scaler = value.cast<bool>();
    else if (key == "init_scale") c.scaler.init_scale = as_f();
    else if (key == "growth_factor") c.scaler.growth_factor = as_f();
    else if (key == "backoff_factor") c.scaler.backoff_factor = as_f();
    else if (key == "growth_interval") c.scaler.growth_interval = value.cast<int>();
    else if (key == "hysteresis") c.scaler.hysteresis = value.cast<int>();
    else if (key == "min_scale") c.scaler.min_scale = as_f();
    else if (key == "max_scale") c.scaler.max_scale = as_f();
    else if (key == "skip_window") c.skip.window = as_i64();
    else if (key == "skip_alert") c.skip.alert_rate = value.cast<double>();
    else if (key == "max_skip_rate") c.skip.max_rate = value.cast<double>();
    else if (key == "skip_patience") c.skip.patience = as_i64();
    else if (key == "data") c.data = as_s();
    else if (key == "init") c.init = as_s();
    else if (key == "checkpoint") c.checkpoint = as_s();
    else if (key == "checkpoint_every") c.checkpoint_every = as_i64();
    else if (key == "resume") c.resume = as_s();
    else if (key == "stop_at") c.stop_at = as_i64();
    else if (key == "clip_mode") c.clip_mode = parse_clip_mode(as_s());
    else if (key == "rollback_on") {
      for (const std::string& r : as_strings(value)) {
        if (r == "skip-rate") c.rollback.on_skip_rate = true;
        else if (r == "nonfinite-loss") c.rollback.on_nonfinite_loss = true;
        else if (r == "divergence") c.rollback.on_divergence = true;
        else throw UsageError("unknown rollback_on '" + r + "': use skip-rate, nonfinite-loss or divergence");
      }
    } else if (key == "rollback_policy") {  // "stop", "fp32", or ("lower-lr", factor)
      if (py::isinstance<py::str>(value)) {
        c.rollback.policy = as_s();
      } else {
        const auto p = value.cast<std::pair<std::string, float>>();
        c.rollback.policy = p.first;
        c.rollback.lr_factor = p.second;
      }
    } else if (key == "rollback_every") c.rollback.every = as_i64();
    else if (key == "rollback_skip_window") c.rollback.skip_window = as_i64();
    else if (key == "rollback_skip_rate") c.rollback.max_skip_rate = value.cast<double>();
    else if (key == "divergence_factor") c.rollback.divergence_factor = value.cast<double>();
    else if (key == "divergence_warmup") c.rollback.divergence_warmup = as_i64();
    else if (key == "max_rollbacks") c.rollback.max_rollbacks = as_i64();
    else if (key == "rollback_report") c.rollback.report = as_s();
    else if (key == "detect_anomaly") c.detect_anomaly = value.cast<bool>();
    else if (key == "fp32_ops") c.fp32_ops = parse_fp32_ops(as_s());
    else if (key == "new_experiment") c.new_experiment = value.cast<bool>();
    else if (key == "show_steps") c.show_steps = value.cast<bool>();
    else if (key == "sync_each_step") c.sync_each_step = value.cast<bool>();
    else if (key == "quiet") c.quiet = value.cast<bool>();
    else
      throw UsageError("train: unknown option '" + key + "' (the options of `belay train --help`, '-' written '_')");
  }
  // As the CLI decides it: loss scaling on for FP16 unless said otherwise.
  c.scaler_explicit = scaler.has_value();
  c.scaler.enabled = scaler.value_or(c.dtype == DType::F16);
  return c;
}

}  // namespace

PYBIND11_MODULE(_belay, m) {
  m.doc() = "belay: mixed-precision training with the safety belts in the engine (C++ core)";
  m.attr("__version__") = BELAY_VERSION;

  // Exceptions. UsageError is also a ValueError (a bad argument, shape or dtype).
  static PyObject* error = PyErr_NewException("belay.Error", PyExc_RuntimeError, nullptr);
  static PyObject* usage_error =
      PyErr_NewException("belay.UsageError", py::make_tuple(py::handle(error), py::handle(PyExc_ValueError)).release().ptr(), nullptr);
  m.attr("Error") = py::handle(error);
  m.attr("UsageError") = py::handle(usage_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UsageError& e) {
      PyErr_SetString(usage_error, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
    } catch (const std::bad_alloc&) {
      // A host container that the caching allocator does not serve (its own failures are a
      // belay::Error with the size): as PyTorch reports an allocation, a RuntimeError.
      PyErr_SetString(error, "cannot allocate memory: a host allocation failed (std::bad_alloc); use smaller sizes");
    } catch (const std::length_error& e) {
      PyErr_SetString(error, (std::string("cannot allocate memory: ") + e.what() + "; use smaller sizes").c_str());
    }
  });

  g_step_row_type = py::module_::import("collections").attr("namedtuple")(
      "StepRow", py::make_tuple("step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
                                "skip_reason", "scaler_scale"));
  g_step_row_type.attr("__module__") = "belay";
  m.attr("StepRow") = g_step_row_type;

  // ---- dtypes and finfo
  py::enum_<DType>(m, "DType").value("float32", DType::F32).value("float16", DType::F16).value("bfloat16", DType::BF16);
  m.attr("float32") = DType::F32;
  m.attr("float16") = DType::F16;
  m.attr("bfloat16") = DType::BF16;
  m.def("dtype", [](py::handle d) { return to_dtype(d); }, "A belay.DType from a name ('fp16'), a DType or a NumPy dtype");
  py::class_<FInfo>(m, "FInfo")
      .def_readonly("bits", &FInfo::bits)
      .def_readonly("max", &FInfo::max)
      .def_readonly("smallest_normal", &FInfo::smallest_normal)
      .def_readonly("smallest_subnormal", &FInfo::smallest_subnormal)
      .def_readonly("eps", &FInfo::eps)
      .def("__repr__", [](const FInfo& f) {
        return py::str("FInfo(bits={}, max={}, smallest_normal={}, smallest_subnormal={}, eps={})")
            .format(f.bits, f.max, f.smallest_normal, f.smallest_subnormal, f.eps);
      });
  m.def("finfo", [](py::handle d) { return finfo(to_dtype(d)); }, py::arg("dtype"));
  m.def("round_to", [](py::handle d, float x) { return round_to(to_dtype(d), x); }, py::arg("dtype"), py::arg("x"),
        "The value x becomes when stored in dtype (round to nearest even)");

  // ---- Tensor: the buffer protocol shares its memory (CPU), numpy() too
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol())
      .def_buffer([](Tensor& t) {
        check_defined("buffer", t);
        if (!t.device().is_cpu())
          throw UsageError("a tensor on " + t.device().str() + " has no host buffer: .to('cpu') first");
        const char* format = t.dtype() == DType::F32 ? "f" : (t.dtype() == DType::F16 ? "e" : "H");
        std::vector<py::ssize_t> shape(t.shape().dims().begin(), t.shape().dims().end());
        std::vector<py::ssize_t> strides(shape.size());
        py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(t.dtype()));
        for (size_t i = shape.size(); i-- > 0;) {
          strides[i] = stride;
          stride *= shape[i];
        }
        return py::buffer_info(t.data(), static_cast<py::ssize_t>(dtype_size(t.dtype())), format,
                               static_cast<py::ssize_t>(shape.size()), shape, strides);
      })
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape().dims())); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("numpy", [](py::object self) { return to_numpy(self.cast<const Tensor&>(), self); },
           "A NumPy array over this tensor's memory (no copy on the CPU); BF16 as ml_dtypes.bfloat16 (an error "
           "without ml_dtypes: never the bits as numbers)")
      .def("numpy_bits", [](py::object self) { return python::to_numpy_bits(self.cast<const Tensor&>(), self); },
           "The raw bits over this tensor's memory: uint16 for fp16/bf16, uint32 for fp32 (no copy on the CPU)")
      .def("tolist", [](const Tensor& t) { return t.to_vector(); }, "The values as floats, flattened")
      .def("item", &Tensor::item)
      .def("to", [](const Tensor& t, py::handle target) {
        if (py::isinstance<py::str>(target)) {
          const std::string s = target.cast<std::string>();
          if (s == "cpu" || s.rfind("cuda", 0) == 0) return t.to(to_device(s));
        }
        return t.to(to_dtype(target));
      }, py::arg("dtype_or_device"))
      .def("clone", &Tensor::clone)
      .def("fill", &Tensor::fill)
      .def("set_element", &Tensor::set_element, py::arg("index"), py::arg("value"))
      .def("__len__", [](const Tensor& t) { return t.rank() ? t.dim(0) : 1; })
      .def("__repr__", [](const Tensor& t) { return "belay.Tensor(" + t.describe() + ")"; });
  m.def("from_numpy", [](const py::array& a, py::object dtype) {
    return python::from_numpy(a, dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)));
  }, py::arg("array"), py::arg("dtype") = py::none(),
     "A tensor over the array's memory, no copy: C-contiguous, writable, in this machine's byte order, float32, "
     "float16, bfloat16 (or uint16 with dtype='bf16'); belay.tensor() copies anything else");
  m.def("tensor", [](py::handle data, py::object dtype, const std::string& device) {
    return to_tensor(data, dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)), to_device(device), true);
  }, py::arg("data"), py::arg("dtype") = py::none(), py::arg("device") = "cpu",
     "A tensor with memory of its own, converted to dtype (default: the array's own if belay has it, else fp32)");
  m.def("zeros", [](const std::vector<int64_t>& shape, py::handle dtype, const std::string& device) {
    return Tensor::zeros(Shape(shape), to_dtype(dtype), to_device(device));
  }, py::arg("shape"), py::arg("dtype") = DType::F32, py::arg("device") = "cpu");

  // ---- Var: the autograd handle
  py::class_<Var>(m, "Var")
      .def(py::init([](py::handle value, bool requires_grad) {
        return Var(to_tensor(value, std::nullopt, Device::cpu(), false), requires_grad);
      }), py::arg("value"), py::arg("requires_grad") = false)
      .def_property_readonly("value", &Var::value)
      .def_property_readonly("grad", [](const Var& v) { return optional_tensor(v.grad()); })
      .def_property_readonly("master", [](const Var& v) { return v.is_parameter() ? py::cast(hand_out_master(v)) : py::none(); },
                             "A parameter's FP32 master (sharing its memory; a forward sees what is written to it), else None")
      .def_property_readonly("name", &Var::name)
      .def_property_readonly("shape", [](const Var& v) { return py::tuple(py::cast(v.shape().dims())); })
      .def_property_readonly("dtype", &Var::dtype)
      .def_property_readonly("requires_grad", &Var::requires_grad)
      .def_property_readonly("is_parameter", &Var::is_parameter)
      .def("numpy", [](const Var& v) { return to_numpy(v.value(), py::cast(v.value())); },
           "The value as a NumPy array sharing its memory (see Tensor.numpy)")
      .def("numpy_bits", [](const Var& v) { return python::to_numpy_bits(v.value(), py::cast(v.value())); },
           "The value's raw bits (see Tensor.numpy_bits)")
      .def("item", [](const Var& v) { return v.value().item(); })
      .def("backward", [](const Var& v, float seed) { v.backward(seed); }, py::arg("seed") = 1.0f)
      .def("zero_grad", &Var::zero_grad, py::arg("set_to_none") = true)
      .def("__add__", [](const Var& a, py::handle b) { return add(a, as_var_on(b, a.device())); })
      .def("__mul__", [](const Var& a, py::handle b) {
        return py::isinstance<py::float_>(b) || py::isinstance<py::int_>(b) ? scale(a, b.cast<float>())
                                                                            : mul(a, as_var_on(b, a.device()));
      })
      .def("__rmul__", [](const Var& a, float s) { return scale(a, s); })
      .def("__matmul__", [](const Var& a, py::handle b) { return matmul(a, as_var_on(b, a.device())); })
      .def("__repr__", [](const Var& v) {
        return "belay.Var(" + (v.name().empty() ? std::string() : v.name() + ": ") + v.value().describe() +
               (v.requires_grad() ? ", requires_grad" : "") + ")";
      });

  m.def("parameter", [](py::handle value, const std::string& name, const std::string& device) {
    return Var::parameter(to_tensor(value, DType::F32, to_device(device), true), name);
  }, py::arg("value"), py::arg("name"), py::arg("device") = "cpu",
     "A trainable parameter for a model written in Python: an FP32 master (a copy of value) that optimizers update");

  // ---- ops (autocast decides the dtype of matmul and linear; losses are FP32)
  m.def("cast", [](py::handle x, py::handle d) { return cast(as_var(x), to_dtype(d)); });
  m.def("matmul", [](py::handle a, py::handle b) { return matmul(as_var(a), as_var(b)); });
  m.def("linear", [](py::handle x, const Var& w, std::optional<Var> b) {
    refresh_working_copy(w);
    if (b) refresh_working_copy(*b);
    return linear(as_var_on(x, w.device()), w, b.value_or(Var()));
  }, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("add", [](py::handle a, py::handle b) { return add(as_var(a), as_var(b)); });
  m.def("mul", [](py::handle a, py::handle b) { return mul(as_var(a), as_var(b)); });
  m.def("scale", [](py::handle a, float s) { return scale(as_var(a), s); });
  m.def("relu", [](py::handle x) { return relu(as_var(x)); });
  m.def("gelu", [](py::handle x) { return gelu(as_var(x)); });
  m.def("sum", [](py::handle x) { return sum(as_var(x)); });
  m.def("mean", [](py::handle x) { return mean(as_var(x)); });
  m.def("mse_loss", [](const Var& pred, py::handle target) { return mse_loss(pred, as_target(target, pred.device())); },
        py::arg("pred"), py::arg("target"), "Mean squared error, FP32 [1]");
  m.def("cross_entropy", [](const Var& logits, py::handle labels) {
    return cross_entropy(logits, as_target(labels, logits.device()));
  }, py::arg("logits"), py::arg("labels"), "Mean cross-entropy of logits [B, C]; labels [B] hold class indices");
  py::class_<NoGradScope>(m, "no_grad", "with belay.no_grad(): ops record no graph")
      .def(py::init<>())
      .def("__enter__", [](NoGradScope& s) { s.enter(); })
      .def("__exit__", [](NoGradScope& s, py::args) { s.exit(); return false; });
  py::class_<AutocastScope>(m, "autocast",
                            "with belay.autocast('fp16'): matrix products in FP16/BF16 with FP32 accumulation")
      .def(py::init([](py::handle d, bool enabled, const std::string& fp32_ops) {
        return std::make_unique<AutocastScope>(to_dtype(d), enabled, parse_fp32_ops(fp32_ops));
      }), py::arg("dtype") = DType::F16, py::arg("enabled") = true, py::arg("fp32_ops") = "",
         "fp32_ops: op classes kept in FP32, e.g. 'linear,gelu' (belay train --fp32-ops)")
      .def("__enter__", [](AutocastScope& s) -> AutocastScope& { s.enter(); return s; },
           py::return_value_policy::reference)
      .def("__exit__", [](AutocastScope& s, py::args) { s.exit(); return false; });
  m.def("autocast_dtype", [] { return autocast_policy().enabled ? py::cast(autocast_policy().dtype) : py::none(); },
        "The dtype matrix products run in on this thread, or None when autocast is off");

  // ---- modules
  py::class_<Module>(m, "Module")
      .def("__call__", [](Module& mod, py::handle x) {
        const auto params = mod.parameters();
        for (const Var& p : params) refresh_working_copy(p);
        return mod(as_var_on(x, params.empty() ? Device::cpu() : params[0].device()));
      })
      .def("forward", [](Module& mod, py::handle x) {
        for (const Var& p : mod.parameters()) refresh_working_copy(p);
        return mod.forward(as_var(x));
      })
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
        return std::make_unique<AdamW>(as_params(params), AdamWOptions{lr, betas.first, betas.second, eps, wd, decay_1d});
      }), py::arg("params"), py::arg("lr") = 1e-3f, py::arg("betas") = std::make_pair(0.9f, 0.999f),
         py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.01f, py::arg("decay_1d") = false,
         "AdamW over a module's (or a list of) parameters; 1-D parameters get no decay unless decay_1d");
  py::class_<Sgd, Optimizer>(m, "SGD")
      .def(py::init([](py::handle params, float lr, float momentum, float wd, bool decay_1d) {
        return std::make_unique<Sgd>(as_params(params), SgdOptions{lr, momentum, wd, decay_1d});
      }), py::arg("params"), py::arg("lr") = 1e-2f, py::arg("momentum") = 0.9f, py::arg("weight_decay") = 0.0f,
         py::arg("decay_1d") = false);

  // ---- GradScaler and SafeStep
  py::class_<ScalerState>(m, "ScalerState")
      .def(py::init<>())
      .def_readwrite("scale", &ScalerState::scale)
      .def_readwrite("growth_tracker", &ScalerState::growth_tracker)
      .def_readwrite("hysteresis_left", &ScalerState::hysteresis_left)
      .def("__repr__", [](const ScalerState& s) {
        return py::str("ScalerState(scale={}, growth_tracker={}, hysteresis_left={})")
            .format(s.scale, s.growth_tracker, s.hysteresis_left);
      });
  py::class_<GradScaler>(m, "GradScaler")
      .def(py::init([](bool enabled, float init_scale, float growth, float backoff, int interval, int hysteresis,
                       float min_scale, float max_scale, const std::string& device) {
        return std::make_unique<GradScaler>(to_device(device), GradScalerOptions{enabled, init_scale, growth, backoff,
                                                                                 interval, hysteresis, min_scale, max_scale});
      }), py::arg("enabled") = true, py::arg("init_scale") = 65536.0f, py::arg("growth_factor") = 2.0f,
         py::arg("backoff_factor") = 0.5f, py::arg("growth_interval") = 2000, py::arg("hysteresis") = 1,
         py::arg("min_scale") = 1.0f, py::arg("max_scale") = 16777216.0f, py::arg("device") = "cpu")
      .def_property_readonly("enabled", &GradScaler::enabled)
      .def_property_readonly("scale", &GradScaler::scale, "The current scale (a host read; 1 when disabled)")
      .def("state", &GradScaler::state)
      .def("load_state", &GradScaler::load_state)
      // PyTorch's manual order, for loops written by hand: scale the loss, unscale_, step, update.
      .def("unscale_", &GradScaler::unscale_)
      .def("step", [](GradScaler& s, Optimizer& o) { py::gil_scoped_release nogil; s.step(o); })
      .def("update", &GradScaler::update)
      .def("found_inf", &GradScaler::found_inf);
  py::class_<SafeStep>(m, "SafeStep")
      .def(py::init([](Optimizer& opt, GradScaler& scaler, std::optional<LrSchedule> schedule, float max_norm,
                       int accum_steps, bool fused, const std::string& clip_mode, bool unscale_grads) {
        return std::make_unique<SafeStep>(
            opt, scaler, schedule.value_or(opt.schedule()),
            SafeStepOptions{max_norm, accum_steps, fused, parse_clip_mode(clip_mode), unscale_grads});
      }), py::arg("optimizer"), py::arg("scaler"), py::arg("schedule") = py::none(),
         py::arg("max_norm") = INFINITY, py::arg("accum_steps") = 1, py::arg("fused") = true,
         py::arg("clip_mode") = "norm", py::arg("unscale_grads") = true,
         py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
         "The whole mixed-precision step in the right order; max_norm=inf measures without clipping; "
         "clip_mode='value' clamps each element to +-max_norm instead. After run(), p.grad holds the true "
         "gradient (unscaled, and clipped as the step applied it), fused or not, as after PyTorch's scaler.step; "
         "unscale_grads=False leaves a fused step's gradients scaled and saves two passes over them")
      .def("run", &run_step, py::arg("loss_fn"),
           "One step: loss_fn(k) returns micro-batch k's FP32 loss (a Var). Returns the StepRow")
      .def_property("next_step", &SafeStep::next_step, &SafeStep::set_next_step)
      .def("set_after_backward", [](SafeStep& s, py::object hook) {
        if (hook.is_none()) {
          s.after_backward = nullptr;
          return;
        }
        // Held through a shared_ptr, so copies of the std::function never touch the Python
        // reference count without the GIL; the last one lets go with the GIL taken.
        auto fn = std::shared_ptr<py::object>(new py::object(hook), [](py::object* o) {
          py::gil_scoped_acquire gil;
          delete o;
        });
        s.after_backward = [fn](int64_t step, Optimizer& opt) {
          py::gil_scoped_acquire gil;
          (*fn)(step, py::cast(&opt, py::return_value_policy::reference));
        };
      }, py::arg("hook"),
           "hook(step, optimizer) runs after the last backward, before the guard (e.g. plant an inf with "
           "optimizer.grads()[0].set_element(0, math.inf)); None removes it");

  // ---- the step log
  m.attr("STEP_LOG_HEADER") = kStepLogHeader;
  m.def("format_step_row", [](py::handle row) { return format_step_row(from_py(row)); });
  py::class_<StepLogWriter>(m, "StepLogWriter", "The CSV log: 8 columns, flushed after every row")
      .def(py::init<const std::string&, int64_t>(), py::arg("path"), py::arg("keep_rows_through") = -1)
      .def("write", [](StepLogWriter& w, py::handle row) { w.write(from_py(row)); })
      .def("close", &StepLogWriter::close)
      .def_property_readonly("path", &StepLogWriter::path)
      .def("__enter__", [](StepLogWriter& w) -> StepLogWriter& { return w; }, py::return_value_policy::reference)
      .def("__exit__", [](StepLogWriter& w, py::args) { w.close(); return false; });

  // ---- checkpoints
  py::class_<RunState>(m, "RunState")
      .def(py::init<>())
      .def_readwrite("next_step", &RunState::next_step)
      .def_readwrite("optimizer_steps", &RunState::optimizer_steps)
      .def_readwrite("scaler", &RunState::scaler)
      .def_readwrite("data_position", &RunState::data_position)
      .def_readwrite("settings", &RunState::settings)
      .def_readwrite("rng_states", &RunState::rng_states)
      .def_readwrite("experiment", &RunState::experiment)
      .def_readwrite("records", &RunState::records)
      .def_readonly("policy_changes", &RunState::policy_changes)
      .def_readonly("scaler_state_loaded", &RunState::scaler_state_loaded);
  m.def("save_checkpoint",
        static_cast<void (*)(const std::string&, const Module&, Optimizer&, const RunState&)>(&save_checkpoint),
        py::arg("path"), py::arg("model"), py::arg("optimizer"), py::arg("state"),
        "Atomic: masters, optimizer state and the run state in one safetensors file");
  m.def("load_checkpoint", &load_checkpoint, py::arg("path"), py::arg("model"), py::arg("optimizer"),
        py::arg("settings") = std::map<std::string, std::string>{}, py::arg("new_experiment") = false,
        "Checks everything, then loads masters and optimizer state; returns the RunState");
  m.def("inspect_checkpoint", [](const std::string& path) {
    const CheckpointInfo info = inspect_checkpoint(path);
    py::dict tensors;
    for (auto& [name, shape] : info.tensors) tensors[py::str(name)] = py::tuple(py::cast(shape));
    return py::dict(py::arg("state") = info.state, py::arg("cpu_isa") = info.cpu_isa, py::arg("tensors") = tensors);
  }, py::arg("path"), "Validates a checkpoint without a model: {'state': RunState, 'cpu_isa': str, 'tensors': {name: shape}}");

  // ---- belay train
  m.def("train", [](py::kwargs kw) {
    TrainConfig c = train_config(kw);
    // Ctrl-C: Python's handler only sets a flag while the run holds no GIL. Between steps the
    // run asks (with the GIL) whether a signal handler raised; if so it stops after the step
    // as the CLI does on SIGINT (checkpoint written if asked), and the exception is raised here.
    py::object raised_type, raised_value, raised_trace;  // what the handler raised, if it did
    c.stop_requested = [&]() -> int {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return 0;
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      PyErr_NormalizeException(&type, &value, &trace);
      raised_type = py::reinterpret_steal<py::object>(type);
      raised_value = py::reinterpret_steal<py::object>(value);
      raised_trace = py::reinterpret_steal<py::object>(trace);
      return SIGINT;
    };
    std::ostringstream out;
    TrainResult result;
    {
      py::gil_scoped_release nogil;
      result = Trainer(c, out).run();
    }
    c.stop_requested = nullptr;
    if (!c.quiet) py::print(out.str(), py::arg("end") = "");
    py::list rows;
    for (const StepRow& r : result.rows) rows.append(to_py(r));
    if (raised_type) {  // a KeyboardInterrupt (or what the user's handler raised), with the rows run
      if (raised_value && PyObject_SetAttrString(raised_value.ptr(), "rows", rows.ptr()) != 0) PyErr_Clear();
      PyErr_Restore(raised_type.release().ptr(), raised_value.release().ptr(), raised_trace.release().ptr());
      throw py::error_already_set();
    }
    if (result.exit_code != 0) {  // the skip-rate stop or a stopping rollback: the CLI exits 1
      py::object e = py::handle(error)(py::str(result.stop_reason.empty() ? "the run stopped early (exit code " +
                                                                                std::to_string(result.exit_code) + ")"
                                                                          : result.stop_reason));
      e.attr("rows") = rows;
      e.attr("exit_code") = result.exit_code;
      PyErr_SetObject(error, e.ptr());
      throw py::error_already_set();
    }
    return rows;
  }, "belay train as a function: the CLI's long options as keywords ('-' as '_'); returns the StepRows. "
     "A run that stops early (max_skip_rate, a stopping rollback) raises belay.Error with the reason, its rows "
     "in .rows; Ctrl-C stops after the step (checkpointing if asked) and raises KeyboardInterrupt, rows in .rows");
}
