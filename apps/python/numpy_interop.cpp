#include "numpy_interop.h"  // beside this file: the module builds against an installed belay too

#include <memory>
#include <string>
#include <vector>

#include "engine/error.h"

namespace belay::python {

namespace {

// ml_dtypes.bfloat16 as a NumPy dtype, or None when ml_dtypes is not installed.
py::object bfloat16_dtype() {
  static py::object cached = [] {
    try {
      return py::object(py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16")));
    } catch (const py::error_already_set&) {
      return py::object(py::none());
    }
  }();
  return cached;
}

bool is_bfloat16(const py::dtype& dt) {
  const py::object bf16 = bfloat16_dtype();
  return !bf16.is_none() && dt.equal(bf16);
}

std::string describe(const py::array& a) {
  return py::str("{} array of shape {}").format(a.dtype(), py::tuple(a.attr("shape"))).cast<std::string>();
}

}  // namespace

DType to_dtype(py::handle obj) {
  if (py::isinstance<DType>(obj)) return obj.cast<DType>();
  if (py::isinstance<py::str>(obj)) return parse_dtype(obj.cast<std::string>());
  const py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  if (dt.kind() == 'f' && dt.itemsize() == 4) return DType::F32;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return DType::F16;
  if (is_bfloat16(dt)) return DType::BF16;
  throw UsageError("no belay dtype for numpy " + py::str(dt).cast<std::string>() + ": use fp32, fp16 or bf16");
}

Tensor from_numpy(const py::array& a, std::optional<DType> want) {
  const py::dtype dt = a.dtype();
  DType dtype;
  if (dt.kind() == 'f' && dt.itemsize() == 4) dtype = DType::F32;
  else if (dt.kind() == 'f' && dt.itemsize() == 2) dtype = DType::F16;
  else if (is_bfloat16(dt)) dtype = DType::BF16;
  else if (dt.kind() == 'u' && dt.itemsize() == 2 && want == DType::BF16) dtype = DType::BF16;  // raw bits
  else
    throw UsageError("from_numpy: a " + describe(a) +
                     " has no belay dtype without a copy (float32, float16, bfloat16, or uint16 with dtype='bf16'); "
                     "belay.tensor() copies and converts");
  if (want && *want != dtype)
    throw UsageError(std::string("from_numpy: the array holds ") + dtype_name(dtype) + ", not " + dtype_name(*want) +
                     "; belay.tensor(array, dtype=...) converts");
  if (!(a.flags() & py::array::c_style))
    throw UsageError("from_numpy: a " + describe(a) +
                     " that is not C-contiguous cannot be shared; numpy.ascontiguousarray() or belay.tensor() copies it");
  std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
  // The tensor holds a reference to the array. The last tensor may let go of it on a thread
  // without the GIL (inside a step), so the release takes the GIL.
  PyObject* ref = a.ptr();
  Py_INCREF(ref);
  std::shared_ptr<void> owner(ref, [](void* p) {
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
  return Tensor::borrow(const_cast<void*>(a.data()), Shape(std::move(dims)), dtype, std::move(owner));
}

Tensor to_tensor(py::handle obj, std::optional<DType> want, Device device, bool copy) {
  Tensor t;
  bool borrowed = false;
  if (py::isinstance<Tensor>(obj)) {
    t = obj.cast<Tensor>();
    borrowed = true;
  } else {
    py::array a = py::array::ensure(obj);
    if (!a) throw UsageError("cannot make a tensor of a " + py::str(py::type::of(obj)).cast<std::string>());
    const py::dtype dt = a.dtype();
    const bool bf16_bits = dt.kind() == 'u' && dt.itemsize() == 2 && want == DType::BF16;
    const bool has_dtype = (dt.kind() == 'f' && (dt.itemsize() == 4 || dt.itemsize() == 2)) || is_bfloat16(dt) || bf16_bits;
    if (!has_dtype)  // float64, integers, lists: converted through float32 into a new array
      a = py::array_t<float, py::array::c_style | py::array::forcecast>(a);
    else if (!(a.flags() & py::array::c_style))
      a = py::module_::import("numpy").attr("ascontiguousarray")(a);
    else
      borrowed = true;
    t = from_numpy(a, bf16_bits ? want : std::nullopt);
  }
  if (want && t.dtype() != *want) {
    t = t.to(*want);
    borrowed = false;
  }
  if (t.device() != device) return t.to(device);
  return copy && borrowed ? t.clone() : t;
}

py::array to_numpy(const Tensor& tensor, py::object base) {
  check_defined("numpy()", tensor);
  Tensor host = tensor;
  if (!tensor.device().is_cpu()) {
    host = tensor.to(Device::cpu());
    base = py::cast(host);
  }
  py::object dt;
  switch (host.dtype()) {
    case DType::F32: dt = py::dtype("float32"); break;
    case DType::F16: dt = py::dtype("float16"); break;
    case DType::BF16: dt = bfloat16_dtype().is_none() ? py::object(py::dtype("uint16")) : bfloat16_dtype(); break;
  }
  std::vector<py::ssize_t> shape(host.shape().dims().begin(), host.shape().dims().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(host.dtype()));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array(py::reinterpret_borrow<py::dtype>(dt), shape, strides, host.data(), base);
}

}  // namespace belay::python
