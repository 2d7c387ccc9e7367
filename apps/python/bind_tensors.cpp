// belay.DType, finfo and Tensor: the buffer protocol and numpy() share a CPU tensor's memory.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "numpy_interop.h"

namespace belay::python {

void bind_tensors(py::module_& m) {
  // ---- dtypes and finfo
  py::enum_<DType>(m, "DType").value("float32", DType::F32).value("float16", DType::F16).value("bfloat16", DType::BF16);
  m.attr("float32") = DType::F32;
  m.attr("float16") = DType::F16;
  m.attr("bfloat16") = DType::BF16;
  m.def("dtype", [](py::handle d) { return to_dtype(d); }, "A belay.DType from a name ('fp16'), a DType or a NumPy dtype");
  py::class_<FInfo>(m, "FInfo")
      .def_readonly("bits", &FInfo::bits)
      .def_readonly("max", &FInfo::max)
      .def_readonly("smallest_normal", &FInfo::smallest_normal)
      .def_readonly("smallest_subnormal", &FInfo::smallest_subnormal)
      .def_readonly("eps", &FInfo::eps)
      .def("__repr__", [](const FInfo& f) {
        return py::str("FInfo(bits={}, max={}, smallest_normal={}, smallest_subnormal={}, eps={})")
            .format(f.bits, f.max, f.smallest_normal, f.smallest_subnormal, f.eps);
      });
  m.def("finfo", [](py::handle d) { return finfo(to_dtype(d)); }, py::arg("dtype"));
  m.def("round_to", [](py::handle d, float x) { return round_to(to_dtype(d), x); }, py::arg("dtype"), py::arg("x"),
        "The value x becomes when stored in dtype (round to nearest even)");

  // ---- Tensor: the buffer protocol shares its memory (CPU), numpy() too
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol())
      .def_buffer([](Tensor& t) {
        check_defined("buffer", t);
        if (!t.device().is_cpu())
          throw UsageError("a tensor on " + t.device().str() + " has no host buffer: .to('cpu') first");
        const char* format = t.dtype() == DType::F32 ? "f" : (t.dtype() == DType::F16 ? "e" : "H");
        std::vector<py::ssize_t> shape(t.shape().dims().begin(), t.shape().dims().end());
        std::vector<py::ssize_t> strides(shape.size());
        py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(t.dtype()));
        for (size_t i = shape.size(); i-- > 0;) {
          strides[i] = stride;
          stride *= shape[i];
        }
        return py::buffer_info(t.data(), static_cast<py::ssize_t>(dtype_size(t.dtype())), format,
                               static_cast<py::ssize_t>(shape.size()), shape, strides);
      })
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape().dims())); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("numpy", [](py::object self) { return to_numpy(self.cast<const Tensor&>(), self); },
           "A NumPy array over this tensor's memory (no copy on the CPU); BF16 as ml_dtypes.bfloat16 (an error "
           "without ml_dtypes: never the bits as numbers)")
      .def("numpy_bits", [](py::object self) { return python::to_numpy_bits(self.cast<const Tensor&>(), self); },
           "The raw bits over this tensor's memory: uint16 for fp16/bf16, uint32 for fp32 (no copy on the CPU)")
      .def("tolist", [](const Tensor& t) { return t.to_vector(); }, "The values as floats, flattened")
      .def("item", &Tensor::item)
      .def("to", [](const Tensor& t, py::handle target) {
        if (py::isinstance<py::str>(target)) {
          const std::string s = target.cast<std::string>();
          if (s == "cpu" || s.rfind("cuda", 0) == 0) return t.to(to_device(s));
        }
        return t.to(to_dtype(target));
      }, py::arg("dtype_or_device"))
      .def("clone", &Tensor::clone)
      .def("fill", &Tensor::fill)
      .def("set_element", &Tensor::set_element, py::arg("index"), py::arg("value"))
      .def("__len__", [](const Tensor& t) { return t.rank() ? t.dim(0) : 1; });  // repr: bind_var_math.cpp
  m.def("from_numpy", [](const py::array& a, py::object dtype) {
    return python::from_numpy(a, dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)));
  }, py::arg("array"), py::arg("dtype") = py::none(),
     "A tensor over the array's memory, no copy: C-contiguous, writable, in this machine's byte order, float32, "
     "float16, bfloat16 (or uint16 with dtype='bf16'); belay.tensor() copies anything else");
  m.def("tensor", [](py::handle data, py::object dtype, const std::string& device) {
    return to_tensor(data, dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)), to_device(device), true);
  }, py::arg("data"), py::arg("dtype") = py::none(), py::arg("device") = "cpu",
     "A tensor with memory of its own, converted to dtype (default: the array's own if belay has it, else fp32)");
  m.def("zeros", [](const std::vector<int64_t>& shape, py::handle dtype, const std::string& device) {
    return Tensor::zeros(Shape(shape), to_dtype(dtype), to_device(device));
  }, py::arg("shape"), py::arg("dtype") = DType::F32, py::arg("device") = "cpu");
}

}  // namespace belay::python
