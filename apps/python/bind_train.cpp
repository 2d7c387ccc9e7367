// belay.train: `belay train` as a function, the CLI's long options as keywords.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <csignal>
#include <optional>
#include <sstream>

#include "amp/autocast.h"
#include "apps/train.h"

#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// A str, or a list of them (a repeatable CLI option).
std::vector<std::string> as_strings(py::handle value) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  return value.cast<std::vector<std::string>>();
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

void bind_train(py::module_& m) {
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
      result = run_training(c, out);
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
      py::object e = py::handle(error_type())(py::str(result.stop_reason.empty() ? "the run stopped early (exit code " +
                                                                                std::to_string(result.exit_code) + ")"
                                                                          : result.stop_reason));
      e.attr("rows") = rows;
      e.attr("exit_code") = result.exit_code;
      PyErr_SetObject(error_type(), e.ptr());
      throw py::error_already_set();
    }
    return rows;
  }, "belay train as a function: the CLI's long options as keywords ('-' as '_'); returns the StepRows. "
     "A run that stops early (max_skip_rate, a stopping rollback) raises belay.Error with the reason, its rows "
     "in .rows; Ctrl-C stops after the step (checkpointing if asked) and raises KeyboardInterrupt, rows in .rows");
}

}  // namespace belay::python
