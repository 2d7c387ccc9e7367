// The Var operators and the value-showing repr of Tensor and Var (bind_var_math.cpp), bound
// by module.cpp's PYBIND11_MODULE once belay.Tensor and belay.Var exist.
#pragma once
#include <pybind11/pybind11.h>

#include "autograd/graph.h"
#include "engine/device.h"

namespace belay::python {

// After bind_tensors and bind_autograd: it adds methods to their classes (each defined once, here).
void bind_var_math(pybind11::module_& m);

}  // namespace belay::python
