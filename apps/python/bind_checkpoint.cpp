// RunState and the checkpoint functions (belay/__init__.py gathers a run's pieces around them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>

#include "amp/checkpoint.h"
#include "apps/run/hf_gpt2.h"
#include "apps/run/model_kinds.h"
#include "autograd/modules.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

void bind_checkpoints(py::module_& m) {
  // ---- checkpoints
  py::class_<RunState>(m, "RunState")
      .def(py::init<>())
      .def_readwrite("next_step", &RunState::next_step)
      .def_readwrite("optimizer_steps", &RunState::optimizer_steps)
      .def_readwrite("scaler", &RunState::scaler)
      .def_readwrite("data_position", &RunState::data_position)
      .def_readwrite("settings", &RunState::settings)
      .def_readwrite("rng_states", &RunState::rng_states)
      .def_readwrite("experiment", &RunState::experiment)
      .def_readwrite("records", &RunState::records)
      .def_readwrite("attachments", &RunState::attachments)
      .def_readonly("policy_changes", &RunState::policy_changes)
      .def_readonly("scaler_state_loaded", &RunState::scaler_state_loaded);
  m.def("save_checkpoint",
        static_cast<void (*)(const std::string&, const Module&, Optimizer&, const RunState&)>(&save_checkpoint),
        py::arg("path"), py::arg("model"), py::arg("optimizer"), py::arg("state"),
        "Atomic: masters, optimizer state and the run state in one safetensors file");
  m.def("load_checkpoint",
        [](const std::string& path, Module& model, Optimizer& opt, const std::map<std::string, std::string>& settings,
           bool new_experiment) { return load_checkpoint(path, model, opt, settings, new_experiment); },
        py::arg("path"), py::arg("model"), py::arg("optimizer"),
        py::arg("settings") = std::map<std::string, std::string>{}, py::arg("new_experiment") = false,
        "Checks everything, then loads masters and optimizer state; returns the RunState");
  // ---- model files and Hugging Face GPT-2 (apps/run/hf_gpt2.h)
  m.def("load_model", [](const std::string& path) {
    const SafetensorsFile file = read_safetensors(path);
    std::unique_ptr<Module> model = model_from_settings(model_file_settings(file), path, Device::cpu());
    load_initial_weights(file, *model);
    return model;
  }, py::arg("path"), "The model of a checkpoint or a model file (belay import), its FP32 weights loaded, on the CPU");
  m.def("import_hf", [](const std::string& dir, const std::string& out) {
    const HfGpt2 model = read_hf_gpt2(dir);
    write_model_file(out, model, {{"imported_from", dir}});
    return model.notes;
  }, py::arg("dir"), py::arg("out"),
        "A Hugging Face GPT-2 directory (config.json + model.safetensors) as a belay model file; returns notes");
  m.def("export_hf", &export_hf_gpt2, py::arg("path"), py::arg("dir"),
        "A GPT checkpoint or model file as config.json + model.safetensors for GPT2LMHeadModel.from_pretrained");
  m.def("inspect_checkpoint", [](const std::string& path) {
    const CheckpointInfo info = inspect_checkpoint(path);
    py::dict tensors;
    for (auto& [name, shape] : info.tensors) tensors[py::str(name)] = py::tuple(py::cast(shape));
    return py::dict(py::arg("state") = info.state, py::arg("cpu_isa") = info.cpu_isa, py::arg("tensors") = tensors);
  }, py::arg("path"), "Validates a checkpoint without a model: {'state': RunState, 'cpu_isa': str, 'tensors': {name: shape}}");
}

}  // namespace belay::python
