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

// Byte order, in one place: belay's kernels read the machine's order. A '>f4' array on a
// little-endian machine (or '<f4' on a big-endian one) holds the same numbers in swapped bytes.
bool native_order(const py::dtype& dt) { return dt.attr("isnative").cast<bool>(); }

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
  if (!native_order(dt))
    throw UsageError("from_numpy: a " + describe(a) + " is in " +
                     (dt.attr("byteorder").cast<std::string>() == ">" ? "big" : "little") +
                     "-endian byte order, not this machine's, and cannot be shared; .astype('" +
                     (dt.attr("byteorder").cast<std::string>() == ">" ? "<" : ">") + dt.attr("str").cast<std::string>().substr(1) +
                     "') converts it, or belay.tensor() copies it");
  if (!a.writeable())
    throw UsageError("from_numpy: a " + describe(a) +
                     " that is read-only (flags.writeable is False) cannot be shared: belay would write through it "
                     "(an optimizer step, fill, set_element, .numpy()); belay.tensor() copies it");
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
    if (!has_dtype)  // float64, integers, lists: converted through float32 into a new array (native order)
      a = py::array_t<float, py::array::c_style | py::array::forcecast>(a);
    else if (!(a.flags() & py::array::c_style) || !native_order(dt) || !a.writeable())
      // A copy in this machine's byte order, C order, of its own (a read-only array is copied
      // rather than borrowed: a tensor over it could be written, or handed back writable).
      a = py::module_::import("numpy").attr("array")(a, py::arg("dtype") = dt.attr("newbyteorder")("="),
                                                     py::arg("order") = "C", py::arg("copy") = true);
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

namespace {

// The tensor on the host (a device tensor is copied, and the copy becomes `base`).
Tensor on_host(const Tensor& tensor, py::object& base) {
  if (tensor.device().is_cpu()) return tensor;
  Tensor host = tensor.to(Device::cpu());
  base = py::cast(host);
  return host;
}

// An array of dtype `dt` over the host tensor's storage, row-major; `base` keeps it alive.
py::array array_over(const Tensor& host, py::object dt, py::object base) {
  std::vector<py::ssize_t> shape(host.shape().dims().begin(), host.shape().dims().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(host.dtype()));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array(py::reinterpret_borrow<py::dtype>(dt), shape, strides, host.data(), base);
}

}  // namespace

py::array to_numpy(const Tensor& tensor, py::object base) {
  check_defined("numpy()", tensor);
  py::object dt;
  switch (tensor.dtype()) {
    case DType::F32: dt = py::dtype("float32"); break;
    case DType::F16: dt = py::dtype("float16"); break;
    case DType::BF16:
      // Never the bits in disguise: as numbers, uint16 bits compare and argmax wrongly.
      if (bfloat16_dtype().is_none())
        throw UsageError("numpy() of a BF16 tensor needs ml_dtypes (pip install ml_dtypes) for NumPy's bfloat16; "
                         ".numpy_bits() gives the raw bits as uint16, .to('fp32').numpy() the values as float32");
      dt = bfloat16_dtype();
      break;
  }
  const Tensor host = on_host(tensor, base);
  return array_over(host, std::move(dt), base);
}

py::array to_numpy_bits(const Tensor& tensor, py::object base) {
  check_defined("numpy_bits()", tensor);
  const Tensor host = on_host(tensor, base);
  return array_over(host, dtype_size(host.dtype()) == 2 ? py::dtype("uint16") : py::dtype("uint32"), base);
}

}  // namespace belay::python
