// belay.Var (the autograd handle), parameter(), the ops, no_grad and autocast.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <unordered_map>

#include "amp/autocast.h"
#include "autograd/ops.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

py::object optional_tensor(const Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

// An op over Vars: the inputs converted with the GIL, the op run without it.
Var unary_op(py::handle x, Var (*op)(const Var&)) {
  const Var in = as_var(x);
  py::gil_scoped_release nogil;
  return op(in);
}
Var binary_op(py::handle a, py::handle b, Var (*op)(const Var&, const Var&)) {
  const Var x = as_var(a), y = as_var(b);
  py::gil_scoped_release nogil;
  return op(x, y);
}
// a <op> b with a a Var: a constant b goes to a's device.
Var binary_op(const Var& a, py::handle b, Var (*op)(const Var&, const Var&)) {
  refresh_working_copy(a);
  const Var y = as_var_on(b, a.device());
  py::gil_scoped_release nogil;
  return op(a, y);
}

// Python's `with belay.autocast("fp16"):` over the C++ RAII guard; nested blocks stack.
class AutocastScope {
 public:
  AutocastScope(DType dtype, bool enabled, uint32_t fp32_ops) : dtype_(dtype), enabled_(enabled), fp32_ops_(fp32_ops) {}
  AutocastScope(const AutocastScope&) = delete;  // holds guards: pybind11 must not copy it
  AutocastScope& operator=(const AutocastScope&) = delete;
  void enter() { guards_.push_back(std::make_unique<Autocast>(dtype_, enabled_, fp32_ops_)); }
  void exit() {
    if (guards_.empty()) throw Error("autocast: __exit__ without __enter__");
    guards_.pop_back();
  }

 private:
  DType dtype_;
  bool enabled_;
  uint32_t fp32_ops_;
  std::vector<std::unique_ptr<Autocast>> guards_;
};

class NoGradScope {
 public:
  NoGradScope() = default;
  NoGradScope(const NoGradScope&) = delete;
  NoGradScope& operator=(const NoGradScope&) = delete;
  void enter() { guards_.push_back(std::make_unique<NoGrad>()); }
  void exit() { guards_.pop_back(); }

 private:
  std::vector<std::unique_ptr<NoGrad>> guards_;
};

}  // namespace

void bind_ops(py::module_& m);

void bind_autograd(py::module_& m) {
  // ---- Var: the autograd handle
  py::class_<Var>(m, "Var")
      .def(py::init([](py::handle value, bool requires_grad) {
        return Var(to_tensor(value, std::nullopt, Device::cpu(), false), requires_grad);
      }), py::arg("value"), py::arg("requires_grad") = false)
      .def_property_readonly("value", &Var::value)
      .def_property_readonly("grad", [](const Var& v) { return optional_tensor(v.grad()); })
      .def_property_readonly("master", [](const Var& v) { return v.is_parameter() ? py::cast(hand_out_master(v)) : py::none(); },
                             "A parameter's FP32 master (sharing its memory; a forward sees what is written to it), else None")
      .def_property_readonly("name", &Var::name)
      .def_property_readonly("shape", [](const Var& v) { return py::tuple(py::cast(v.shape().dims())); })
      .def_property_readonly("dtype", &Var::dtype)
      .def_property_readonly("requires_grad", &Var::requires_grad)
      .def_property_readonly("is_parameter", &Var::is_parameter)
      .def_property_readonly("_id", [](const Var& v) { return reinterpret_cast<uintptr_t>(v.node()); },
                             "The node's identity: two handles of one parameter share it (belay.Module's registry)")
      .def("_set_name", [](const Var& v, const std::string& name) {
        if (!v.is_parameter()) throw UsageError("_set_name: only a parameter is renamed");
        v.node()->name = name;
      }, py::arg("name"), "belay.Module names a parameter by its attribute path (optimizer state and checkpoints use it)")
      .def("numpy", [](const Var& v) { return to_numpy(v.value(), py::cast(v.value())); },
           "The value as a NumPy array sharing its memory (see Tensor.numpy)")
      .def("numpy_bits", [](const Var& v) { return python::to_numpy_bits(v.value(), py::cast(v.value())); },
           "The value's raw bits (see Tensor.numpy_bits)")
      .def("item", [](const Var& v) { return v.value().item(); })
      .def("backward", [](const Var& v, float seed) { v.backward(seed); }, py::arg("seed") = 1.0f,
           py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &Var::zero_grad, py::arg("set_to_none") = true)
      // + - * / and repr: bind_var_math.cpp (broadcasting, Python scalars, the values shown).
      .def("__matmul__", [](const Var& a, py::handle b) { return binary_op(a, b, matmul); });

  bind_ops(m);
}

void bind_ops(py::module_& m) {
  m.def("parameter", [](py::handle value, const std::string& name, const std::string& device) {
    return Var::parameter(to_tensor(value, DType::F32, to_device(device), true), name);
  }, py::arg("value"), py::arg("name") = "", py::arg("device") = "cpu",
     "A trainable parameter for a model written in Python: an FP32 master (a copy of value) that optimizers update. "
     "A belay.Module names it by its attribute path; given to an optimizer alone, give it a name");

  // ---- ops (autocast decides the dtype of matmul and linear; losses are FP32)
  // Each op converts its inputs with the GIL and computes without it, as the step does.
  m.def("cast", [](py::handle x, py::handle d) {
    const Var in = as_var(x);
    const DType dtype = to_dtype(d);
    py::gil_scoped_release nogil;
    return cast(in, dtype);
  });
  m.def("matmul", [](py::handle a, py::handle b) { return binary_op(a, b, matmul); });
  m.def("linear", [](py::handle x, const Var& w, std::optional<Var> b) {
    refresh_working_copy(w);
    if (b) refresh_working_copy(*b);
    const Var in = as_var_on(x, w.device()), bias = b.value_or(Var());
    py::gil_scoped_release nogil;
    return linear(in, w, bias);
  }, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("add", [](py::handle a, py::handle b) { return binary_op(a, b, add); });
  m.def("mul", [](py::handle a, py::handle b) { return binary_op(a, b, mul); });
  m.def("scale", [](py::handle a, float s) {
    const Var in = as_var(a);
    py::gil_scoped_release nogil;
    return scale(in, s);
  });
  m.def("relu", [](py::handle x) { return unary_op(x, relu); });
  m.def("gelu", [](py::handle x, const std::string& approximate) {
    if (approximate != "none" && approximate != "tanh")
      throw UsageError("gelu: approximate must be 'none' or 'tanh', got '" + approximate + "'");
    return unary_op(x, approximate == "tanh" ? gelu_tanh : gelu);
  }, py::arg("x"), py::arg("approximate") = "none",
     "GELU as torch.nn.functional.gelu: approximate='none' the erf form, 'tanh' the tanh form (GPT-2's)");
  m.def("sum", [](py::handle x) { return unary_op(x, [](const Var& v) { return sum(v); }); });
  m.def("mean", [](py::handle x) { return unary_op(x, [](const Var& v) { return mean(v); }); });
  m.def("mse_loss", [](const Var& pred, py::handle target) {
    const Tensor t = as_target(target, pred.device());
    py::gil_scoped_release nogil;
    return mse_loss(pred, t);
  }, py::arg("pred"), py::arg("target"), "Mean squared error, FP32 [1]");
  m.def("cross_entropy", [](const Var& logits, py::handle labels) {
    const Tensor t = as_target(labels, logits.device());
    py::gil_scoped_release nogil;
    return cross_entropy(logits, t);
  }, py::arg("logits"), py::arg("labels"), "Mean cross-entropy of logits [B, C]; labels [B] hold class indices");
  m.def("embedding", [](const Var& table, py::handle ids) {
    refresh_working_copy(table);
    const Tensor t = as_target(ids, table.device());
    py::gil_scoped_release nogil;
    return embedding(table, t);
  }, py::arg("table"), py::arg("ids"),
     "Rows of table [V, D] picked by ids (integers, any shape): [*ids.shape, D] in the table's dtype. "
     "The table's gradient is summed in FP32, the same bits at any thread count");
  m.def("layer_norm", [](py::handle x, std::optional<Var> w, std::optional<Var> b, float eps) {
    if (w) refresh_working_copy(*w);
    if (b) refresh_working_copy(*b);
    const Var in = w ? as_var_on(x, w->device()) : as_var(x);
    const Var weight = w.value_or(Var()), bias = b.value_or(Var());
    py::gil_scoped_release nogil;
    return layer_norm(in, weight, bias, eps);
  }, py::arg("x"), py::arg("weight") = py::none(), py::arg("bias") = py::none(), py::arg("eps") = 1e-5f,
     "LayerNorm over the last dim (torch's F.layer_norm(x, x.shape[-1:], weight, bias, eps)): mean and variance in "
     "FP32 whatever x's dtype, the result in x's dtype");
  // Attention's products and head views (autograd/batched_ops.cpp).
  m.def("bmm", [](py::handle a, py::handle b, bool trans_a, bool trans_b) {
    const Var x = as_var(a);
    const Var y = as_var_on(b, x.device());
    refresh_working_copy(x);
    refresh_working_copy(y);
    py::gil_scoped_release nogil;
    return bmm(x, y, trans_a, trans_b);
  }, py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false,
     "[..., M, K] @ [..., K, N] per item of the shared leading dims (or b a matrix [K, N] for every item); "
     "trans_a / trans_b read the last two dims transposed (q @ k^T is bmm(q, k, trans_b=True)). "
     "Autocast: FP16/BF16, as matmul");
  m.def("attention", [](py::handle q, py::handle k, py::handle v, bool causal, std::optional<float> scale,
                        int64_t heads) {
    const Var a = as_var(q);
    const Var b = as_var_on(k, a.device()), c = as_var_on(v, a.device());
    for (const Var* x : {&a, &b, &c}) refresh_working_copy(*x);
    py::gil_scoped_release nogil;
    return heads == 1 ? attention(a, b, c, causal, scale) : attention_heads(a, b, c, heads, causal, scale);
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = true, py::arg("scale") = py::none(),
     py::arg("heads") = 1,
     "softmax(scale q k^T) v for q [..., Tq, d] and k, v [..., Tk, d] in one fused kernel that never stores the "
     "[Tq, Tk] scores (torch's F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale); causal "
     "aligns the mask at the end when Tq != Tk). scale defaults to 1/sqrt(d); d <= 128. heads = H > 1: q, k, v "
     "[..., T, H d] with the heads side by side, as Linears give them (the output alike), read in place: the "
     "values of merge_heads(attention(split_heads(q, H), ...)) with no copies. Autocast class 'attention': q, k, v "
     "in FP16/BF16, the softmax in FP32 inside the kernel");
  m.def("transpose_dims", [](py::handle x, int64_t dim0, int64_t dim1) {
    const Var in = as_var(x);
    py::gil_scoped_release nogil;
    return transpose(in, dim0, dim1);
  }, py::arg("x"), py::arg("dim0"), py::arg("dim1"), "x with dims dim0 and dim1 swapped (torch.transpose; a copy)");
  m.def("split_heads", [](py::handle x, int64_t heads) {
    const Var in = as_var(x);
    py::gil_scoped_release nogil;
    return split_heads(in, heads);
  }, py::arg("x"), py::arg("heads"), "[..., T, H * d] -> [..., H, T, d]");
  m.def("merge_heads", [](py::handle x) {
    const Var in = as_var(x);
    py::gil_scoped_release nogil;
    return merge_heads(in);
  }, py::arg("x"), "[..., H, T, d] -> [..., T, H * d]");
  py::class_<NoGradScope>(m, "no_grad", "with belay.no_grad(): ops record no graph")
      .def(py::init<>())
      .def("__enter__", [](NoGradScope& s) { s.enter(); })
      .def("__exit__", [](NoGradScope& s, py::args) { s.exit(); return false; });
  py::class_<AutocastScope>(m, "autocast",
                            "with belay.autocast('fp16'): matrix products in FP16/BF16 with FP32 accumulation")
      .def(py::init([](py::handle d, bool enabled, const std::string& fp32_ops) {
        return std::make_unique<AutocastScope>(to_dtype(d), enabled, parse_fp32_ops(fp32_ops));
      }), py::arg("dtype") = DType::F16, py::arg("enabled") = true, py::arg("fp32_ops") = "",
         "fp32_ops: op classes kept in FP32, e.g. 'linear,gelu' (belay train --fp32-ops)")
      .def("__enter__", [](AutocastScope& s) -> AutocastScope& { s.enter(); return s; },
           py::return_value_policy::reference)
      .def("__exit__", [](AutocastScope& s, py::args) { s.exit(); return false; });
  m.def("autocast_dtype", [] { return autocast_policy().enabled ? py::cast(autocast_policy().dtype) : py::none(); },
        "The dtype matrix products run in on this thread, or None when autocast is off");
}

}  // namespace belay::python
