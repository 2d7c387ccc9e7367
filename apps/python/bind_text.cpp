// belay.BpeTokenizer (apps/text/bpe.h): GPT-2's byte-level BPE from Python, and the tokenizer a
// tokens file, checkpoint or model file carries (belay.tokenizer_of).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "apps/text/bpe.h"
#include "apps/text/bpe_source.h"
#include "bindings.h"
#include "engine/safetensors.h"

namespace belay::python {

namespace {

// str as its UTF-8 bytes, bytes as they are: the tokenizer reads bytes.
std::string text_bytes(const py::object& text) {
  if (py::isinstance<py::bytes>(text)) return text.cast<std::string>();
  if (py::isinstance<py::str>(text)) return text.cast<std::string>();  // pybind11 encodes str as UTF-8
  throw py::type_error("text must be str or bytes, got " + std::string(py::str(py::type::of(text).attr("__name__"))));
}

}  // namespace

void bind_text(py::module_& m) {
  py::class_<BpeTokenizer, std::shared_ptr<BpeTokenizer>>(
      m, "BpeTokenizer", "GPT-2's byte-level BPE, token for token as Hugging Face tokenizers encodes")
      .def_static("from_directory", &BpeTokenizer::from_directory, py::arg("dir"),
                  "tokenizer.json if the directory has one, else vocab.json + merges.txt")
      .def_static("from_files", &BpeTokenizer::from_files, py::arg("vocab_json"), py::arg("merges_txt"))
      .def_static("from_tokenizer_json", &BpeTokenizer::from_tokenizer_json, py::arg("path"))
      .def_static("train", [](const py::object& text, int64_t merges) {
        const std::string bytes = text_bytes(text);
        py::gil_scoped_release nogil;
        return train_bpe(bytes, merges);
      }, py::arg("text"), py::arg("merges"), "A BPE of `merges` merges trained on text (ids 0-255: the bytes)")
      .def("encode", [](const BpeTokenizer& t, const py::object& text) {
        const std::string bytes = text_bytes(text);
        py::gil_scoped_release nogil;
        return t.encode(bytes);
      }, py::arg("text"), "str (as UTF-8) or bytes -> a list of ids")
      .def("decode", [](const BpeTokenizer& t, const std::vector<int32_t>& ids) { return py::bytes(t.decode(ids)); },
           py::arg("ids"), "ids -> bytes")
      .def("token_bytes", [](const BpeTokenizer& t, int32_t id) { return py::bytes(t.token_bytes(id)); }, py::arg("id"))
      .def("write_files", &BpeTokenizer::write_files, py::arg("dir"), "vocab.json, merges.txt and tokenizer.json")
      .def("serialized", &BpeTokenizer::serialized)
      .def_property_readonly("vocab_size", &BpeTokenizer::vocab_size)
      .def_property_readonly("merges", &BpeTokenizer::merges)
      .def("__repr__", [](const BpeTokenizer& t) {
        return "<belay.BpeTokenizer vocab " + std::to_string(t.vocab_size()) + ", " + std::to_string(t.merges()) +
               " merges>";
      });
  m.def("tokenizer_of", [](const std::string& path) -> std::shared_ptr<BpeTokenizer> {
    return std::const_pointer_cast<BpeTokenizer>(recorded_bpe_tokenizer(read_safetensors(path).metadata(), path));
  }, py::arg("path"), "The BPE a tokens file, checkpoint or model file carries, or None (byte tokens)");
}

}  // namespace belay::python
