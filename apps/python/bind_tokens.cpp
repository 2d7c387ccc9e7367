// belay.load_tokens / belay.TokenDataset: a tokens file (apps/data/make_text_corpus.py) as the
// GPT's batches, the same windows `belay train --model gpt` draws for the same seed, so a
// Python loop (or PyTorch beside belay) sees exactly the trainer's batches.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "apps/run/token_dataset.h"
#include "bindings.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// Token ids [B, T] held as FP32 (exact below 2^24) -> an int64 array, as a user indexes with.
py::array_t<int64_t> ids_of(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  const float* src = host.data_as<float>();
  py::array_t<int64_t> out({host.shape()[0], host.shape()[1]});
  int64_t* dst = out.mutable_data();
  for (int64_t i = 0; i < host.numel(); ++i) dst[i] = static_cast<int64_t>(src[i]);
  return out;
}

py::tuple pair_of(const Batch& b) { return py::make_tuple(ids_of(b.x), ids_of(b.y)); }

}  // namespace

void bind_tokens(py::module_& m) {
  // ---- token data
  py::class_<TokenDataset>(m, "TokenDataset",
                           "A tokens file's training split as seeded random windows and its held-out split in order: "
                           "the batches of `belay train --model gpt` (belay.load_tokens makes one)")
      .def("next", [](TokenDataset& d, int64_t batch) { return pair_of(d.next(batch, Device::cpu())); },
           py::arg("batch"),
           "The next `batch` training windows: (x, y), int64 arrays [batch, context], y the ids after x's")
      .def("heldout_batch", [](const TokenDataset& d, int64_t first, int64_t count) {
        return pair_of(d.heldout_batch(first, count, Device::cpu()));
      }, py::arg("first"), py::arg("count"),
         "Held-out windows [first, first + count): (x, y) int64 arrays [count, context] (window w starts at w * context)")
      .def_property_readonly("vocab", &TokenDataset::vocab)
      .def_property_readonly("context", &TokenDataset::context)
      .def_property_readonly("heldout_windows", &TokenDataset::heldout_windows)
      .def_property_readonly("train_tokens", [](const TokenDataset& d) { return d.train_ids().size(); })
      .def_property_readonly("heldout_tokens", [](const TokenDataset& d) { return d.heldout_ids().size(); })
      .def_property_readonly("unigram_entropy_nats", &TokenDataset::unigram_entropy_nats,
                             "The training split's unigram entropy: the loss of a model that ignores context")
      .def_property_readonly("position", &TokenDataset::position,
                             "What the next batch will be (the windows drawn so far), as a checkpoint stores it")
      .def("set_position", &TokenDataset::set_position, py::arg("position"),
           "Continue from a position that `position` gave (the same seed's)")
      .def("__repr__", [](const TokenDataset& d) { return "<belay.TokenDataset " + d.describe() + ">"; });
  m.def("load_tokens", [](const py::object& path, int64_t context, uint64_t seed) {
    const std::string file = py::str(py::module_::import("os").attr("fspath")(path));  // a str or a pathlib.Path
    py::gil_scoped_release nogil;
    return load_token_dataset(file, context, seed);
  }, py::arg("path"), py::arg("context"), py::arg("seed") = 0,
     "A tokens file as a TokenDataset of windows of `context` tokens; the training windows' order comes from "
     "`seed` (belay.train(model='gpt', data=path, seed=seed) draws the same)");
}

}  // namespace belay::python
