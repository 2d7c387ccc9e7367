// The operators a PyTorch user reaches for on belay.Var: arithmetic with
// broadcasting and Python scalars, **, unary functions, softmax/log_softmax, sums over an
// axis, .T, .reshape, indexing on the first dim, float() and np.asarray(); and a repr of
// Tensor and Var that shows the values (abridged when large), as torch.Tensor's does.
// Wiring only: every number comes from autograd/ops.h. The ops run with the GIL released,
// as the step does; operands are converted (from Python objects) before it is released.
#include "bind_var_math.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "engine/error.h"
#include "bindings.h"
#include "numpy_interop.h"

namespace belay::python {
namespace {

namespace py = pybind11;
using Release = py::call_guard<py::gil_scoped_release>;

bool is_number(py::handle o) { return py::isinstance<py::float_>(o) || py::isinstance<py::int_>(o); }
std::string type_name(py::handle o) { return py::str(py::type::of(o).attr("__name__")); }

// A Python number becomes a one-element constant of the Var's own dtype (x_fp16 + 1.0 stays
// FP16, as in PyTorch); anything else goes through the module's operand conversion.
Var operand_like(py::handle o, const Var& like) {
  if (is_number(o))
    return Var(Tensor::full(like.shape().rank() == 0 ? Shape{} : Shape{1}, o.cast<float>(), like.dtype(), like.device()));
  return as_var_on(o, like.device());
}

// a op b with b converted under the GIL, the op run without it.
Var binary_with(BinaryOp op, const Var& a, py::handle b_obj, bool reflected) {
  refresh_working_copy(a);  // a parameter whose master Python wrote (bindings.h)
  const Var b = operand_like(b_obj, a);
  py::gil_scoped_release nogil;
  return reflected ? binary(op, b, a) : binary(op, a, b);
}

// ---- repr: the values, abridged beyond kSummarizeAt elements to the first and last
// kEdgeItems of every dim, in one number format for the whole tensor (as torch and NumPy).
constexpr int64_t kSummarizeAt = 1000;
constexpr int64_t kEdgeItems = 3;

struct NumberFormat {
  bool integers = true, scientific = false;
  size_t width = 1;
  std::string operator()(float v) const {
    char buf[64];
    if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
    else if (std::isinf(v)) std::snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
    else if (scientific) std::snprintf(buf, sizeof buf, "%.4e", static_cast<double>(v));
    else if (integers) std::snprintf(buf, sizeof buf, "%.0f.", static_cast<double>(v));
    else std::snprintf(buf, sizeof buf, "%.4f", static_cast<double>(v));
    std::string s(buf);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

NumberFormat choose_format(const std::vector<float>& v) {
  NumberFormat f;
  double max_abs = 0.0, min_abs = INFINITY;
  for (float x : v) {
    if (!std::isfinite(x)) continue;
    const double a = std::fabs(static_cast<double>(x));
    max_abs = std::max(max_abs, a);
    if (a > 0) min_abs = std::min(min_abs, a);
    if (x != std::nearbyint(x)) f.integers = false;
  }
  f.scientific = max_abs >= 1e8 || (!f.integers && (min_abs < 1e-4 || max_abs / min_abs > 1e3));
  if (f.scientific) f.integers = false;
  for (float x : v) f.width = std::max(f.width, f(x).size());
  return f;
}

// Which indices of a dim of extent n are shown (-1: the "..." between the edges).
std::vector<int64_t> shown(int64_t n, bool summarize) {
  std::vector<int64_t> out;
  if (!summarize || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int64_t i = 0; i < kEdgeItems; ++i) out.push_back(i);
  out.push_back(-1);
  for (int64_t i = n - kEdgeItems; i < n; ++i) out.push_back(i);
  return out;
}

void format_dim(const std::vector<float>& v, const std::vector<int64_t>& dims, size_t d, int64_t offset, bool summarize,
                const NumberFormat& f, size_t indent, std::string& out) {
  int64_t stride = 1;
  for (size_t k = d + 1; k < dims.size(); ++k) stride *= dims[k];
  out += "[";
  bool first = true;
  for (int64_t i : shown(dims[d], summarize)) {
    if (!first) {
      if (d + 1 == dims.size()) out += ", ";
      else out += "," + std::string(dims.size() - d - 1, '\n') + std::string(indent + d + 1, ' ');
    }
    first = false;
    if (i < 0) out += "...";
    else if (d + 1 == dims.size()) out += f(v[static_cast<size_t>(offset + i)]);
    else format_dim(v, dims, d + 1, offset + i * stride, summarize, f, indent, out);
  }
  out += "]";
}

// "belay.Tensor([[1.0000, 2.5000]], shape=[1, 2], dtype=fp16, device=cpu" (the caller closes it).
std::string repr_of(const char* prefix, const Tensor& t) {
  std::string out = prefix;
  if (!t.defined()) return out + "undefined";
  const std::vector<float> all = t.to_vector();  // FP16/BF16 as the float values they hold
  const std::vector<int64_t>& dims = t.shape().dims();
  const bool summarize = t.numel() > kSummarizeAt;
  std::vector<float> visible;  // the format is chosen from what is printed
  if (!summarize) visible = all;
  else
    for (size_t i = 0; i < all.size(); ++i) {
      size_t rest = i;
      bool edge = true;
      for (size_t k = dims.size(); k-- > 0;) {
        const int64_t idx = static_cast<int64_t>(rest % static_cast<size_t>(dims[k]));
        rest /= static_cast<size_t>(dims[k]);
        if (dims[k] > 2 * kEdgeItems && idx >= kEdgeItems && idx < dims[k] - kEdgeItems) edge = false;
      }
      if (edge) visible.push_back(all[i]);
    }
  const NumberFormat f = choose_format(visible);
  if (dims.empty()) out += f(all[0]);
  else if (t.numel() == 0) out += "[]";
  else format_dim(all, dims, 0, 0, summarize, f, out.size(), out);
  return out + ", shape=" + t.shape().str() + ", dtype=" + dtype_name(t.dtype()) + ", device=" + t.device().str();
}

std::string var_repr(const Var& v) {
  std::string s = repr_of("belay.Var(", v.value());
  if (v.requires_grad()) s += ", requires_grad=True";
  if (!v.name().empty()) s += ", name='" + v.name() + "'";
  return s + ")";
}

// var[i] and var[a:b] on the first dim. An int out of range is an IndexError, so that
// `for row in var` stops as Python's sequence protocol expects.
Var index_var(const Var& v, py::handle key) {
  if (v.shape().rank() == 0) throw Error("indexing: a 0-d value has no dim to index; use float(v)");
  const int64_t rows = v.shape()[0];
  if (py::isinstance<py::int_>(key)) {
    const int64_t i = key.cast<int64_t>();
    if (i < -rows || i >= rows)
      throw py::index_error("index " + std::to_string(i) + " is out of range for dim 0 of size " + std::to_string(rows));
    py::gil_scoped_release nogil;
    return select_row(v, i);
  }
  if (py::isinstance<py::slice>(key)) {
    py::ssize_t start = 0, stop = 0, step = 0, len = 0;
    if (!key.cast<py::slice>().compute(static_cast<py::ssize_t>(rows), &start, &stop, &step, &len))
      throw py::error_already_set();
    if (step != 1)
      throw Error("indexing: slices with a step (" + std::to_string(step) + ") are not supported; belay slices rows [a:b] of dim 0");
    py::gil_scoped_release nogil;
    return slice_rows(v, start, start + len);
  }
  throw Error("indexing: belay indexes dim 0 with an int or a slice [a:b]; got " +
              type_name(key) + " (index the NumPy array from .numpy() for more)");
}

std::vector<int64_t> shape_args(const py::args& args) {
  // reshape(2, 3) or reshape((2, 3)) or reshape([2, 3]), as torch accepts.
  if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) return args[0].cast<std::vector<int64_t>>();
  return args.cast<std::vector<int64_t>>();
}

Var reduce(const Var& x, std::optional<int64_t> axis, bool keepdim, bool is_mean) {
  py::gil_scoped_release nogil;
  if (!axis) {
    if (keepdim) throw Error(std::string(is_mean ? "mean" : "sum") + ": keepdim needs an axis");
    return is_mean ? mean(x) : sum(x);
  }
  return is_mean ? mean(x, *axis, keepdim) : sum(x, *axis, keepdim);
}

void bind_operators(py::class_<Var>& cls) {
  cls.def("__add__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Add, a, b, false); })
      .def("__mul__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Mul, a, b, false); })
      .def("__rmul__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Mul, a, b, true); })
      .def("__radd__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Add, a, b, true); })
      .def("__sub__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Sub, a, b, false); })
      .def("__rsub__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Sub, a, b, true); })
      .def("__truediv__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Div, a, b, false); })
      .def("__rtruediv__", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Div, a, b, true); })
      .def("__neg__", &neg, Release())
      .def("__pow__", [](const Var& x, py::handle p) {
        if (!is_number(p)) throw py::type_error("x ** p: belay takes a number as the exponent (x ** 2.0), not " + type_name(p));
        const float e = p.cast<float>();
        py::gil_scoped_release nogil;
        return pow(x, e);
      }, py::arg("exponent"), "x ** p for a number p (elementwise; FP32 under autocast)")
      .def("__rpow__", [](const Var& x, py::handle base) {
        // s ** x = exp(x ln s), for a number s > 0 (as torch, whose gradient is the same).
        if (!is_number(base)) throw py::type_error("s ** x: belay takes a number as the base, not " + type_name(base));
        if (!(base.cast<double>() > 0.0))
          throw py::value_error("s ** x: belay takes a number s > 0 as the base, not " + std::string(py::str(py::repr(base))));
        const float ln_s = static_cast<float>(std::log(base.cast<double>()));
        py::gil_scoped_release nogil;
        return exp(scale(x, ln_s));
      }, py::arg("base"))
      .def("__float__", [](const Var& v) {
        if (v.value().numel() != 1)
          throw Error("float(): needs a one-element value, got " + v.value().describe() + "; use .numpy() for more");
        return static_cast<double>(v.value().item());
      })
      .def("__array__", [](const Var& v, py::object dtype, py::object /*copy*/) {
        py::array a = to_numpy(v.value(), py::cast(v.value()));
        return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
      }, py::arg("dtype") = py::none(), py::arg("copy") = py::none(), "np.asarray(var): the value as a NumPy array")
      .def("__len__", [](const Var& v) {
        if (v.shape().rank() == 0) throw py::type_error("len() of a 0-d value");
        return v.shape()[0];
      })
      .def("__getitem__", &index_var, py::arg("key"), "var[i] or var[a:b] on dim 0 (a copy; the gradient flows back)")
      .def_property_readonly("T", [](const Var& x) { py::gil_scoped_release nogil; return transpose(x); },
                             "The transpose of a matrix (a copy)")
      .def("reshape", [](const Var& x, const py::args& dims) {
        const std::vector<int64_t> d = shape_args(dims);
        py::gil_scoped_release nogil;
        return reshape(x, d);
      }, "The same values in another shape (one extent may be -1); shares the value's memory");
}

void bind_functions(py::module_& m, py::class_<Var>& cls) {
  const char* kSoftmaxDoc = "Over the last dim, in FP32 with the row maximum subtracted, returned in x's dtype; "
                            "causal=True masks column c > row t of [..., T, T] scores";
  const char* kReduceDoc = "Over all elements, or over `axis` (keepdim keeps it with extent 1); FP32, summed in double";
  for (py::object target : {py::object(m), py::object(cls)}) {
    const bool method = !py::isinstance<py::module_>(target);
    auto def = [&](const char* name, auto&& f, auto&&... extra) {
      if (method) cls.def(name, f, extra...);
      else m.def(name, f, py::arg("x"), extra...);  // a method's self takes no annotation
    };
    def("exp", [](const Var& x) { return exp(x); }, Release(), "e^x elementwise (FP32 under autocast)");
    def("log", [](const Var& x) { return log(x); }, Release(), "The natural logarithm (FP32 under autocast)");
    def("tanh", [](const Var& x) { return tanh(x); }, Release());
    def("sigmoid", [](const Var& x) { return sigmoid(x); }, Release());
    def("softmax", [](const Var& x, bool causal) { return softmax(x, causal); }, py::arg("causal") = false, Release(),
        kSoftmaxDoc);
    def("log_softmax", [](const Var& x, bool causal) { return log_softmax(x, causal); }, py::arg("causal") = false,
        Release(), kSoftmaxDoc);
    def("sum", [](const Var& x, std::optional<int64_t> axis, bool keepdim) { return reduce(x, axis, keepdim, false); },
        py::arg("axis") = py::none(), py::arg("keepdim") = false, kReduceDoc);
    def("mean", [](const Var& x, std::optional<int64_t> axis, bool keepdim) { return reduce(x, axis, keepdim, true); },
        py::arg("axis") = py::none(), py::arg("keepdim") = false, kReduceDoc);
  }
  m.def("sub", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Sub, a, b, false); });
  m.def("div", [](const Var& a, py::handle b) { return binary_with(BinaryOp::Div, a, b, false); });
  m.def("neg", &neg, Release());
  m.def("pow", [](const Var& x, float p) { return pow(x, p); }, Release());
  m.def("transpose", [](const Var& x) { return transpose(x); }, Release());
  m.def("reshape", [](const Var& x, const std::vector<int64_t>& shape) { return reshape(x, shape); }, Release());
}

}  // namespace

void bind_var_math(py::module_& m) {
  py::class_<Var> cls(py::object(m.attr("Var")));
  bind_operators(cls);
  // ndarray op Var: NumPy defers to the Var's reflected operator (the gradient is kept)
  // instead of converting the Var through __array__.
  cls.attr("__array_priority__") = 1000;
  bind_functions(m, cls);
  cls.def("__repr__", &var_repr).def("__str__", &var_repr);
  auto tensor_repr = [](const Tensor& t) { return repr_of("belay.Tensor(", t) + ")"; };
  py::class_<Tensor>(py::object(m.attr("Tensor"))).def("__repr__", tensor_repr).def("__str__", tensor_repr);
}

}  // namespace belay::python
