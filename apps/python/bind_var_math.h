// The Var operators and the value-showing repr of Tensor and Var (bind_var_math.cpp), bound
// by module.cpp's PYBIND11_MODULE once belay.Var exists.
#pragma once
#include <pybind11/pybind11.h>

#include "autograd/graph.h"
#include "engine/device.h"

namespace belay::python {

// `operand(o, device)`: how the module turns an operand into a Var (a Var as it is, its
// working copy refreshed; anything array-like a constant on `device`).
using OperandFn = Var (*)(pybind11::handle o, Device device);
void bind_var_math(pybind11::module_& m, OperandFn operand);

}  // namespace belay::python
