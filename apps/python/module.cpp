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
//
// One function per group of bindings (bindings.h), each in its file bind_*.cpp.
#include <pybind11/pybind11.h>

#include "bind_var_math.h"
#include "bindings.h"

PYBIND11_MODULE(_belay, m) {
  namespace bp = belay::python;
  m.doc() = "belay: mixed-precision training with the safety belts in the engine (C++ core)";
  m.attr("__version__") = BELAY_VERSION;
  bp::bind_errors(m);
  bp::bind_tensors(m);
  bp::bind_autograd(m);
  bp::bind_var_math(m);  // the Var operators, and reprs that show values
  bp::bind_modules(m);
  bp::bind_tokens(m);
  bp::bind_optimizers(m);
  bp::bind_safe_step(m);
  bp::bind_checkpoints(m);
  bp::bind_train(m);
  bp::bind_text(m);
}
