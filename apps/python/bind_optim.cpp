// LR schedules and the optimizers: AdamW and SGD.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "optim/adamw.h"
#include "optim/sgd.h"

#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {


void bind_optimizers(py::module_& m) {
  // ---- LR schedules and optimizers
  py::class_<LrSchedule>(m, "LrSchedule", "The LR as a function of the number of APPLIED steps")
      .def_static("constant", &LrSchedule::constant, py::arg("lr"))
      .def_static("warmup_cosine", &LrSchedule::warmup_cosine, py::arg("peak_lr"), py::arg("warmup_steps"),
                  py::arg("total_steps"), py::arg("min_lr") = 0.0f)
      .def("lr_at", &LrSchedule::lr_at, py::arg("applied_steps"))
      .def_readonly("peak_lr", &LrSchedule::peak_lr)
      .def_readonly("warmup_steps", &LrSchedule::warmup_steps)
      .def_readonly("total_steps", &LrSchedule::total_steps)
      .def_readonly("min_lr", &LrSchedule::min_lr);
  py::class_<Optimizer>(m, "Optimizer")
      .def("step", [](Optimizer& o) { py::gil_scoped_release nogil; o.step(); }, "A plain step: no scaling, no clipping")
      .def("zero_grad", &Optimizer::zero_grad, py::arg("set_to_none") = true)
      .def_property_readonly("params", &Optimizer::params)
      .def_property_readonly("name", &Optimizer::name)
      .def_property_readonly("step_count", &Optimizer::step_count, "Applied steps (a host read)")
      .def("set_schedule", &Optimizer::set_schedule)
      .def("set_lr", &Optimizer::set_lr)
      .def_property_readonly("schedule", &Optimizer::schedule)
      .def_property_readonly("lr", [](const Optimizer& o) { return o.lr_tensor().item(); },
                             "The LR the last step used or would have used")
      .def("grads", [](const Optimizer& o) {
        std::vector<Tensor> out;
        for (const Tensor* g : o.grads()) out.push_back(*g);
        return out;
      }, "The gradients the next step reads (tensors sharing their memory)")
      .def("state_tensors", [](Optimizer& o) {
        py::dict out;
        for (auto& [name, t] : o.state_tensors()) out[py::str(name)] = *t;
        return out;
      }, "The FP32 state (moments, momentum buffers) by checkpoint name");
  py::class_<AdamW, Optimizer>(m, "AdamW")
      .def(py::init([](py::handle params, float lr, std::pair<float, float> betas, float eps, float wd, bool decay_1d) {
        return std::make_unique<AdamW>(as_params(params), AdamWOptions{lr, betas.first, betas.second, eps, wd, decay_1d});
      }), py::arg("params"), py::arg("lr") = 1e-3f, py::arg("betas") = std::make_pair(0.9f, 0.999f),
         py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.01f, py::arg("decay_1d") = false,
         "AdamW over a module's (or a list of) parameters; 1-D parameters get no decay unless decay_1d");
  py::class_<Sgd, Optimizer>(m, "SGD")
      .def(py::init([](py::handle params, float lr, float momentum, float wd, bool decay_1d) {
        return std::make_unique<Sgd>(as_params(params), SgdOptions{lr, momentum, wd, decay_1d});
      }), py::arg("params"), py::arg("lr") = 1e-2f, py::arg("momentum") = 0.9f, py::arg("weight_decay") = 0.0f,
         py::arg("decay_1d") = false);
}

}  // namespace belay::python
