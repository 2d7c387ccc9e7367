// What the binding files share: one function per group of bindings (PYBIND11_MODULE in
// module.cpp calls them in order) and the few conversions more than one group needs.
#pragma once
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "amp/safe_step.h"
#include "amp/step_log.h"
#include "autograd/graph.h"
#include "engine/backend.h"

namespace belay::python {

namespace py = pybind11;

// The groups, in the order the module defines them (a later group's signatures name the
// earlier groups' types, so pybind11 can name them in docstrings and casts).
void bind_errors(py::module_& m);        // bind_errors.cpp: belay.Error, belay.UsageError
void bind_tensors(py::module_& m);       // bind_tensors.cpp: DType, finfo, Tensor, from_numpy
void bind_autograd(py::module_& m);      // bind_autograd.cpp: Var, ops, no_grad, autocast
void bind_modules(py::module_& m);       // bind_modules.cpp: Module, Linear, Mlp, ..., GptConfig, Gpt
void bind_tokens(py::module_& m);        // bind_train.cpp: TokenDataset, load_tokens
void bind_optimizers(py::module_& m);    // bind_optim.cpp: LrSchedule, Optimizer, AdamW, SGD
void bind_safe_step(py::module_& m);     // bind_safe_step.cpp: GradScaler, SafeStep, StepRow, the log
void bind_checkpoints(py::module_& m);   // bind_checkpoint.cpp: RunState, save/load/inspect
void bind_train(py::module_& m);         // bind_train.cpp: belay.train
void bind_text(py::module_& m);          // bind_text.cpp: BpeTokenizer, tokenizer_of

// belay.Error (a RuntimeError) and belay.UsageError (an Error and a ValueError).
PyObject* error_type();
PyObject* usage_error_type();
// A library message with the CLI's options as this module's keywords ("--new-experiment" ->
// "new_experiment=True", "--fp32-ops" -> "fp32_ops"): every belay error raised here passes it.
std::string python_message(const std::string& text);

// The StepRow named tuple (called by bind_safe_step, before anything returns a row).
void bind_step_row(py::module_& m);

Device to_device(const std::string& name);

// StepRow <-> the Python named tuple (or anything with its eight attributes).
py::object to_py(const StepRow& r);
StepRow from_py(py::handle o);

// An op's input: a Var as it is (its working copy refreshed if Python was handed its master);
// a Tensor or anything array-like as a constant (no grad), on `device`.
Var as_var(py::handle o);
Var as_var_on(py::handle o, Device device);
Tensor as_target(py::handle o, Device device);
// Before a forward reads parameter p: its working copy refreshed from a master Python may have written.
void refresh_working_copy(const Var& p);
// A parameter's FP32 master, for Python: remembered, so forwards refresh the working copy from it.
const Tensor& hand_out_master(const Var& v);
// A module's parameters, or an iterable of parameters (Vars); anything else a TypeError
// that names `what` (e.g. "AdamW: params").
std::vector<Var> as_params(py::handle o, const std::string& what = "params");

// The Python type's name of o ("int", "belay.Var"), for messages.
std::string type_name(py::handle o);
// o as a T, or a TypeError "<what> must be <expected>, got <type>" (never pybind11's
// "Unable to cast Python instance ... to C++ type").
template <class T>
T cast_arg(py::handle o, const std::string& what, const char* expected) {
  try {
    return o.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(what + " must be " + expected + ", got " + type_name(o));
  }
}

}  // namespace belay::python
