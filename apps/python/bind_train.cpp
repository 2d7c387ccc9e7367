// belay.train: `belay train` as a function, the CLI's long options as keywords.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <csignal>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "amp/autocast.h"
#include "apps/run/dataset.h"
#include "apps/run/trainer.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// A str, or a list of them (a repeatable CLI option).
std::vector<std::string> as_strings(py::handle value, const std::string& what) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  return cast_arg<std::vector<std::string>>(value, what, "a str or a list of them");
}

// spike: "STEP:FACTOR" as on the CLI ("3:1e8"), a list of them, or {step: factor}.
void read_spikes(py::handle value, std::map<int64_t, float>& spikes) {
  if (py::isinstance<py::dict>(value)) {
    for (auto [s, f] : py::reinterpret_borrow<py::dict>(value))
      spikes[cast_arg<int64_t>(s, "train: spike's step", "an int")] = cast_arg<float>(f, "train: spike's factor", "a number");
    return;
  }
  for (const std::string& s : as_strings(value, "train: spike")) {
    const size_t colon = s.find(':');
    size_t used_step = 0, used_factor = 0;
    int64_t step = -1;
    float factor = 0.0f;
    try {
      step = std::stoll(s.substr(0, colon), &used_step);
      factor = std::stof(s.substr(colon + 1), &used_factor);
    } catch (const std::exception&) {
      used_step = 0;
    }
    if (colon == std::string::npos || used_step != colon || used_factor != s.size() - colon - 1 || step < 0)
      throw UsageError("train: spike expects 'STEP:FACTOR' (e.g. '12:1e8'), got '" + s + "'");
    spikes[step] = factor;
  }
}

// data=(x, y): arrays (or what NumPy makes arrays of) as the run's dataset, checked here so a
// mistake is named before the run: x [N, in] floats; y [N, out] floats (regression) or [N]
// integer class labels in [0, classes) (classification; classes: out_features, else the
// largest label + 1). Rows are taken in order and wrap around, as with a --data file.
std::function<std::unique_ptr<Dataset>()> array_dataset(py::handle data, std::optional<int64_t> out_features) {
  const bool pair = (py::isinstance<py::tuple>(data) || py::isinstance<py::list>(data)) && py::len(data) == 2;
  if (!pair) throw py::type_error("train: data must be a safetensors path (str) or a pair (x, y) of arrays, got " + type_name(data));
  const py::module_ np = py::module_::import("numpy");
  const py::array x = np.attr("asarray")(data[py::int_(0)]), y = np.attr("asarray")(data[py::int_(1)]);
  const std::string xk = py::str(x.dtype().attr("kind")), yk = py::str(y.dtype().attr("kind"));
  if (xk != "f") throw UsageError("train: data x must hold floats, got dtype " + std::string(py::str(x.dtype())));
  if (x.ndim() != 2 || x.shape(0) == 0 || x.shape(1) == 0)
    throw UsageError("train: data x must be [N, in_features] with N, in_features > 0, got shape " +
                     std::string(py::str(py::tuple(py::cast(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()))))));
  const int64_t n = x.shape(0);
  const bool classification = yk == "i" || yk == "u";
  if (classification ? y.ndim() != 1 : (yk != "f" || y.ndim() != 2))
    throw UsageError("train: data y must be [N, out_features] floats (regression) or [N] integer class labels, got " +
                     std::to_string(y.ndim()) + "-D " + std::string(py::str(y.dtype())));
  if (y.shape(0) != n)
    throw UsageError("train: data x has " + std::to_string(n) + " rows, y " + std::to_string(y.shape(0)) + ": give one target per row");
  for (const auto& [name, a] : {std::pair<const char*, const py::array&>{"x", x}, {"y", y}})
    if (!np.attr("isfinite")(a).attr("all")().cast<bool>())
      throw UsageError(std::string("train: data ") + name + " holds inf or NaN; remove those rows");
  int64_t classes = 0;
  if (classification) {
    const int64_t lo = np.attr("min")(y).cast<int64_t>(), hi = np.attr("max")(y).cast<int64_t>();
    classes = out_features.value_or(hi + 1);
    if (lo < 0 || hi >= classes)
      throw UsageError("train: data y's labels span [" + std::to_string(lo) + ", " + std::to_string(hi) + "], classes are [0, " +
                       std::to_string(classes) + ")");
  } else if (out_features && *out_features != y.shape(1)) {
    throw UsageError("train: out_features is " + std::to_string(*out_features) + " but data y has " +
                     std::to_string(y.shape(1)) + " columns");
  }
  Tensor xt = to_tensor(x, DType::F32, Device::cpu(), true);
  Tensor yt = to_tensor(np.attr("asarray")(y, "float32"), DType::F32, Device::cpu(), true);
  const std::string name = "arrays x[" + std::to_string(n) + ", " + std::to_string(x.shape(1)) + "]";
  return [xt, yt, classification, classes, name] { return make_tensor_dataset(xt, yt, classification, classes, name); };
}

// The rollback options (--rollback-*, --divergence-*, --max-rollbacks); false for another key.
bool read_rollback_option(RollbackOptions& r, const std::string& key, py::handle value) {
  const std::string what = "train: " + key;
  auto as_i64 = [&] { return cast_arg<int64_t>(value, what, "an int"); };
  auto as_d = [&] { return cast_arg<double>(value, what, "a number"); };
  if (key == "rollback_on") {
    for (const std::string& cond : as_strings(value, what)) {
      if (cond == "skip-rate") r.on_skip_rate = true;
      else if (cond == "nonfinite-loss") r.on_nonfinite_loss = true;
      else if (cond == "divergence") r.on_divergence = true;
      else throw UsageError("unknown rollback_on '" + cond + "': use skip-rate, nonfinite-loss or divergence");
    }
  } else if (key == "rollback_policy") {  // "stop", "fp32", or ("lower-lr", factor)
    if (py::isinstance<py::str>(value)) {
      r.policy = value.cast<std::string>();
    } else {
      const auto p = cast_arg<std::pair<std::string, float>>(value, what, "'stop', 'fp32' or ('lower-lr', factor)");
      r.policy = p.first;
      r.lr_factor = p.second;
    }
  } else if (key == "rollback_every") r.every = as_i64();
  else if (key == "rollback_skip_window") r.skip_window = as_i64();
  else if (key == "rollback_skip_rate") r.max_skip_rate = as_d();
  else if (key == "divergence_factor") r.divergence_factor = as_d();
  else if (key == "divergence_warmup") r.divergence_warmup = as_i64();
  else if (key == "max_rollbacks") r.max_rollbacks = as_i64();
  else if (key == "rollback_report") r.report = cast_arg<std::string>(value, what, "a str");
  else return false;
  return true;
}

// dtype: a name ('fp16'), a belay.DType or a NumPy dtype; anything else a TypeError naming the option.
DType train_dtype(py::handle value) {
  try {
    return to_dtype(value);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error("train: dtype must be 'fp32', 'fp16', 'bf16' or a dtype, got " + type_name(value));
  }
}

// belay.train(**options): the names are belay train's long options with '-' as '_'.
TrainConfig train_config(const py::kwargs& kw) {
  TrainConfig c;
  std::optional<bool> scaler;
  std::optional<int64_t> out_features;
  py::object data = py::none();
  for (auto [key_h, value] : kw) {
    const std::string key = py::str(key_h);
    const std::string what = "train: " + key;
    auto as_i64 = [&] { return cast_arg<int64_t>(value, what, "an int"); };
    auto as_f = [&] { return cast_arg<float>(value, what, "a number"); };
    auto as_s = [&] { return cast_arg<std::string>(value, what, "a str"); };
    auto as_b = [&] { return cast_arg<bool>(value, what, "a bool"); };
    if (key == "model") c.model = as_s();
    else if (key == "in_features" || key == "in") c.in_features = as_i64();
    else if (key == "out_features" || key == "out") c.out_features = *(out_features = as_i64());
    else if (key == "hidden") c.hidden = as_i64();
    else if (key == "layers") c.layers = cast_arg<int>(value, what, "an int");
    else if (key == "batch") c.batch = as_i64();
    else if (key == "micro_batch") c.micro_batch = as_i64();
    else if (key == "steps") c.steps = as_i64();
    else if (key == "seed") c.seed = cast_arg<uint64_t>(value, what, "an int >= 0");
    else if (key == "optimizer") c.optimizer = as_s();
    else if (key == "lr") c.lr = as_f();
    else if (key == "weight_decay") c.weight_decay = as_f();
    else if (key == "momentum") c.momentum = as_f();
    else if (key == "schedule") c.schedule = as_s();
    else if (key == "warmup") c.warmup = as_i64();
    else if (key == "dtype") c.dtype = train_dtype(value);
    else if (key == "device") c.device = as_s();
    else if (key == "grad_dtype") {
      const std::string g = as_s();
      if (g != "fp32" && g != "compute") throw UsageError("unknown grad_dtype '" + g + "': use fp32 or compute");
      c.low_precision_grads = g == "compute";
    } else if (key == "clip") c.max_norm = as_f();
    else if (key == "unfused") c.fused = !as_b();
    else if (key == "inject_inf") {
      if (py::isinstance<py::int_>(value)) c.inject_inf.insert(as_i64());
      else for (int64_t s : cast_arg<std::vector<int64_t>>(value, what, "an int or a list of ints")) c.inject_inf.insert(s);
    } else if (key == "spike") {
      read_spikes(value, c.spikes);
    } else if (key == "csv") c.csv = as_s();
    else if (key == "scaler") scaler = as_b();
    else if (key == "no_scaler") scaler = !as_b();
    else if (key == "init_scale") c.scaler.init_scale = as_f();
    else if (key == "growth_factor") c.scaler.growth_factor = as_f();
    else if (key == "backoff_factor") c.scaler.backoff_factor = as_f();
    else if (key == "growth_interval") c.scaler.growth_interval = cast_arg<int>(value, what, "an int");
    else if (key == "hysteresis") c.scaler.hysteresis = cast_arg<int>(value, what, "an int");
    else if (key == "min_scale") c.scaler.min_scale = as_f();
    else if (key == "max_scale") c.scaler.max_scale = as_f();
    else if (key == "skip_window") c.skip.window = as_i64();
    else if (key == "skip_alert") c.skip.alert_rate = cast_arg<double>(value, what, "a number");
    else if (key == "max_skip_rate") c.skip.max_rate = cast_arg<double>(value, what, "a number");
    else if (key == "skip_patience") c.skip.patience = as_i64();
    else if (key == "data") data = py::reinterpret_borrow<py::object>(value);
    else if (key == "init") c.init = as_s();
    else if (key == "checkpoint") c.checkpoint = as_s();
    else if (key == "checkpoint_every") c.checkpoint_every = as_i64();
    else if (key == "resume") c.resume = as_s();
    else if (key == "stop_at") c.stop_at = as_i64();
    else if (key == "clip_mode") c.clip_mode = parse_clip_mode(as_s());
    else if (read_rollback_option(c.rollback, key, value)) continue;
    else if (key == "detect_anomaly") c.detect_anomaly = as_b();
    else if (key == "fp32_ops") c.fp32_ops = parse_fp32_ops(as_s());
    else if (key == "new_experiment") c.new_experiment = as_b();
    else if (key == "show_steps") c.show_steps = as_b();
    else if (key == "sync_each_step") c.sync_each_step = as_b();
    else if (key == "quiet") c.quiet = as_b();
    else
      throw UsageError("train: unknown option '" + key + "' (the options of `belay train --help`, '-' written '_'; "
                       "--in/--out are in_features/out_features; the multi-process options --dist* and --bucket-mb "
                       "are the CLI's alone)");
  }
  if (py::isinstance<py::str>(data)) c.data = data.cast<std::string>();
  else if (!data.is_none()) c.make_dataset = array_dataset(data, out_features);
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
      py::object e = py::handle(error_type())(py::str(result.stop_reason.empty() ? "the run stopped early (exit code " +
                                                                                std::to_string(result.exit_code) + ")"
                                                                          : python_message(result.stop_reason)));
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
