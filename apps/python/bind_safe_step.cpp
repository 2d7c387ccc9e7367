// GradScaler, SafeStep and the step log. SafeStep.run releases the GIL for the step; the
// Python loss function (or after_backward hook) takes it back while it runs. An exception
// raised there propagates unchanged, traceback and all, and the step is abandoned before
// anything was written (SafeStep::enqueue drops the gradients and the scaler's checks).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>

#include "amp/census_log.h"
#include "amp/grad_scaler.h"
#include "amp/safe_step.h"
#include "amp/step_log.h"
#include "apps/run/train.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// A Python callable as SafeStep's loss function: called with the GIL, and it must return a Var.
Var call_loss(const py::function& fn, int micro_batch) {
  py::gil_scoped_acquire gil;
  py::object out = fn(micro_batch);
  if (!py::isinstance<Var>(out))
    throw UsageError("SafeStep: the loss function returned a " + py::str(py::type::of(out)).cast<std::string>() +
                     ", not a belay.Var (the FP32 loss, e.g. belay.mse_loss(model(x), y))");
  return out.cast<Var>();
}

// A step's census as Python sees it: {parameter name: {count: value}}, in backward order, then
// the forward's cast sites as {"cast:<site>": {...}} when they were counted.
py::dict census_to_py(const StepRow& row, DType format) {
  py::dict out;
  std::vector<TensorCensus> all = row.census;
  for (TensorCensus c : row.cast_census) {
    c.name = cast_row_name(c.name);
    all.push_back(std::move(c));
  }
  for (const TensorCensus& c : all) {
    py::dict d;
    d["numel"] = c.numel;
    d["nonfinite"] = c.nonfinite;
    d["amax"] = c.amax;
    d["underflow_to_zero"] = c.underflow;
    d["subnormal"] = c.subnormal;
    d["zeros"] = c.zeros;
    d["headroom_bits"] = c.headroom_bits(format);
    out[py::str(c.name)] = d;
  }
  return out;
}

py::object run_step(SafeStep& step, const py::function& loss_fn) {
  StepRow row;
  {
    py::gil_scoped_release nogil;
    row = step.run([&](int k) { return call_loss(loss_fn, k); });
  }
  if (step.options().census) return py::make_tuple(to_py(row), census_to_py(row, step.options().census_format));
  return to_py(row);
}

}  // namespace

void bind_safe_step(py::module_& m) {
  bind_step_row(m);
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
        return std::make_unique<GradScaler>(to_device(device), GradScalerOptions{{growth, backoff, interval, hysteresis,
                                                                                  min_scale, max_scale}, enabled, init_scale});
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
                       int accum_steps, bool fused, const std::string& clip_mode, bool unscale_grads, bool census,
                       const std::string& census_dtype, bool census_casts) {
        SafeStepOptions o{max_norm, accum_steps, fused, parse_clip_mode(clip_mode), unscale_grads};
        o.census = census;
        o.census_format = parse_dtype(census_dtype);
        o.census_casts = census_casts;
        return std::make_unique<SafeStep>(opt, scaler, schedule.value_or(opt.schedule()), o);
      }), py::arg("optimizer"), py::arg("scaler"), py::arg("schedule") = py::none(),
         py::arg("max_norm") = INFINITY, py::arg("accum_steps") = 1, py::arg("fused") = true,
         py::arg("clip_mode") = "norm", py::arg("unscale_grads") = true, py::arg("census") = false,
         py::arg("census_dtype") = "fp16", py::arg("census_casts") = false,
         py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
         "The whole mixed-precision step in the right order; max_norm=inf measures without clipping; "
         "clip_mode='value' clamps each element to +-max_norm instead. After run(), p.grad holds the true "
         "gradient (unscaled, and clipped as the step applied it), fused or not, as after PyTorch's scaler.step; "
         "unscale_grads=False leaves a fused step's gradients scaled and saves two passes over them; "
         "census=True: the guard also counts, per gradient as the step holds it (scaled), what census_dtype "
         "(fp16 or bf16) would make of it; census_casts=True (with census): also what the forward's casts to "
         "fp16/bf16 lost, per cast site")
      .def("run", &run_step, py::arg("loss_fn"),
           "One step: loss_fn(k) returns micro-batch k's FP32 loss (a Var). Returns the StepRow; with census=True "
           "the pair (StepRow, census), census a dict {parameter name: {numel, nonfinite, amax, underflow_to_zero, "
           "subnormal, zeros, headroom_bits}} in backward order, then the cast sites as 'cast:<site>' keys with "
           "census_casts=True")
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
}

}  // namespace belay::python
