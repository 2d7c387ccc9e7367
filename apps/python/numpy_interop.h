// Tensors to and from NumPy for the Python module, without copies where the layout allows:
// a C-contiguous, aligned float32/float16/bfloat16 array becomes a tensor over the array's
// own memory, and a CPU tensor becomes an array over the tensor's storage. BF16 is a
// ml_dtypes.bfloat16 array (ml_dtypes is a dependency); its bits are to_numpy_bits().
// Arrays in the other byte order, or read-only, are never shared: copied by to_tensor,
// refused by from_numpy.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "engine/tensor.h"

namespace belay::python {

namespace py = pybind11;

// The dtype a user named: a belay.DType, a string ("fp16", "bf16", ...) or a NumPy dtype.
DType to_dtype(py::handle obj);

// The array's memory as a tensor (no copy). `dtype` is needed only to read a uint16 array as
// BF16 bits. Anything else (float64, a strided view, ...) is a UsageError naming the problem
// and the fix (belay.tensor() copies and converts).
Tensor from_numpy(const py::array& array, std::optional<DType> dtype);

// A tensor, an array or anything NumPy makes an array of, as a tensor of `dtype` (default: the
// array's own if belay has it, else FP32) on `device`. Borrowed when from_numpy can, unless
// `copy` asks for memory of its own.
Tensor to_tensor(py::handle obj, std::optional<DType> dtype, Device device, bool copy);

// A NumPy array over the tensor's storage; `base` keeps the storage alive (the Python
// object holding the tensor). A device tensor is copied to the host first. BF16 needs
// ml_dtypes (a UsageError saying so without it: never uint16 bits posing as numbers).
py::array to_numpy(const Tensor& tensor, py::object base);
// The same storage as unsigned integers of the element's size: uint16 for FP16/BF16, uint32
// for FP32 (the bits, asked for by name).
py::array to_numpy_bits(const Tensor& tensor, py::object base);

}  // namespace belay::python
