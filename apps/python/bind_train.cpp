// belay.train: `belay train` as a function, the CLI's long options as keywords; and
// belay.load_tokens / belay.TokenDataset: a tokens file (apps/data/make_text_corpus.py) as the
// GPT's batches, the same windows `belay train --model gpt` draws for the same seed, so a
// Python loop (or PyTorch beside belay) sees exactly the trainer's batches. (One file: each
// pybind11 file costs CI ~11 s of compiling.)
#include <pybind11/eval.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <csignal>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>
#include <variant>

#include "amp/autocast.h"
#include "apps/run/dataset.h"
#include "apps/run/token_dataset.h"
#include "apps/run/model_kinds.h"
#include "apps/run/train_options.h"
#include "apps/run/trainer.h"
#include "autograd/modules.h"
#include "bindings.h"
#include "engine/error.h"
#include "numpy_interop.h"

namespace belay::python {

namespace {

// A str, or a list of them (a repeatable CLI option).
std::vector<std::string> as_strings(py::handle value, const std::string& what) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  return cast_arg<std::vector<std::string>>(value, what, "a str or a list of them");
}

// A float as the words a CLI user would type for it: 9 significant digits give it back exactly.
std::string exact_words(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

// spike: "STEP:FACTOR" as on the CLI ("3:1e8"), a list of them, or {step: factor} (written
// as the CLI's words).
std::vector<std::string> spike_words(py::handle value) {
  if (!py::isinstance<py::dict>(value)) return as_strings(value, "train: spike");
  std::vector<std::string> words;
  for (auto [s, f] : py::reinterpret_borrow<py::dict>(value))
    words.push_back(std::to_string(cast_arg<int64_t>(s, "train: spike's step", "an int")) + ":" +
                    exact_words(cast_arg<float>(f, "train: spike's factor", "a number")));
  return words;
}

// data=(x, y): arrays (or what NumPy makes arrays of) as the run's dataset, checked here so a
// mistake is named before the run: x [N, in] floats; y [N, out] floats (regression) or [N]
// integer class labels in [0, classes) (classification; classes: out_features, else the
// largest label + 1). Rows are taken in order and wrap around, as with a --data file.
std::function<std::unique_ptr<Dataset>()> array_dataset(py::handle data, std::optional<int64_t> out_features) {
  const bool pair = (py::isinstance<py::tuple>(data) || py::isinstance<py::list>(data)) && py::len(data) == 2;
  if (!pair) throw py::type_error("train: data must be a safetensors path (str) or a pair (x, y) of arrays, got " + type_name(data));
  const py::module_ np = py::module_::import("numpy");
  const py::array x = np.attr("asarray")(data[py::int_(0)]), y = np.attr("asarray")(data[py::int_(1)]);
  const std::string xk = py::str(x.dtype().attr("kind")), yk = py::str(y.dtype().attr("kind"));
  if (xk != "f") throw UsageError("train: data x must hold floats, got dtype " + std::string(py::str(x.dtype())));
  if (x.ndim() != 2 || x.shape(0) == 0 || x.shape(1) == 0)
    throw UsageError("train: data x must be [N, in_features] with N, in_features > 0, got shape " +
                     std::string(py::str(py::tuple(py::cast(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()))))));
  const int64_t n = x.shape(0);
  const bool classification = yk == "i" || yk == "u";
  if (classification ? y.ndim() != 1 : (yk != "f" || y.ndim() != 2))
    throw UsageError("train: data y must be [N, out_features] floats (regression) or [N] integer class labels, got " +
                     std::to_string(y.ndim()) + "-D " + std::string(py::str(y.dtype())));
  if (y.shape(0) != n)
    throw UsageError("train: data x has " + std::to_string(n) + " rows, y " + std::to_string(y.shape(0)) + ": give one target per row");
  for (const auto& [name, a] : {std::pair<const char*, const py::array&>{"x", x}, {"y", y}})
    if (!np.attr("isfinite")(a).attr("all")().cast<bool>())
      throw UsageError(std::string("train: data ") + name + " holds inf or NaN; remove those rows");
  int64_t classes = 0;
  if (classification) {
    const int64_t lo = np.attr("min")(y).cast<int64_t>(), hi = np.attr("max")(y).cast<int64_t>();
    classes = out_features.value_or(hi + 1);
    if (lo < 0 || hi >= classes)
      throw UsageError("train: data y's labels span [" + std::to_string(lo) + ", " + std::to_string(hi) + "], classes are [0, " +
                       std::to_string(classes) + ")");
  } else if (out_features && *out_features != y.shape(1)) {
    throw UsageError("train: out_features is " + std::to_string(*out_features) + " but data y has " +
                     std::to_string(y.shape(1)) + " columns");
  }
  Tensor xt = to_tensor(x, DType::F32, Device::cpu(), true);
  Tensor yt = to_tensor(np.attr("asarray")(y, "float32"), DType::F32, Device::cpu(), true);
  const std::string name = "arrays x[" + std::to_string(n) + ", " + std::to_string(x.shape(1)) + "]";
  return [xt, yt, classification, classes, name] { return make_tensor_dataset(xt, yt, classification, classes, name); };
}

// dtype: a name ('fp16'), a belay.DType or a NumPy dtype; anything else a TypeError naming the option.
DType train_dtype(py::handle value) {
  try {
    return to_dtype(value);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error("train: dtype must be 'fp32', 'fp16', 'bf16' or a dtype, got " + type_name(value));
  }
}

// rollback_policy: 'stop', 'fp32', or ('lower-lr', factor), as the CLI's words.
std::vector<std::string> policy_words(py::handle value) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  const auto p = cast_arg<std::pair<std::string, float>>(value, "train: rollback_policy",
                                                         "'stop', 'fp32' or ('lower-lr', factor)");
  return {p.first, exact_words(p.second)};
}

// One keyword's value into its row's field, read as the field's type; a wrong type is a
// TypeError naming the keyword ("train: steps").
void read_keyword(const TrainOption& row, const std::string& key, py::handle value, TrainOptions& o) {
  const std::string what = "train: " + key;
  std::visit(
      [&](auto field) {
        auto& target = field(o);
        using T = std::decay_t<decltype(target)>;
        if constexpr (std::is_same_v<T, bool>) {
          target = cast_arg<bool>(value, what, "a bool");
        } else if constexpr (std::is_same_v<T, std::string>) {
          target = cast_arg<std::string>(value, what, "a str");
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          const std::vector<std::string> words = as_strings(value, what);
          target.insert(target.end(), words.begin(), words.end());
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (py::isinstance<py::int_>(value)) target.push_back(cast_arg<int64_t>(value, what, "an int"));
          else
            for (int64_t s : cast_arg<std::vector<int64_t>>(value, what, "an int or a list of ints")) target.push_back(s);
        } else if constexpr (std::is_floating_point_v<T>) {
          target = cast_arg<T>(value, what, "a number");
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          target = cast_arg<T>(value, what, "an int >= 0");
        } else {
          target = cast_arg<T>(value, what, "an int");
        }
      },
      row.field);
}

// The keywords whose Python values are not the CLI's words: data (a path or arrays, read by
// the caller), dtype (also a belay.DType or NumPy dtype), spike (also {step: factor}),
// rollback_policy (also ('lower-lr', factor)), and False for a flag with a negation
// (scaler=False is --no-scaler). False when `row` is read as its field's type.
bool read_python_value(const TrainOption& row, const std::string& key, py::handle value, TrainOptions& o,
                       py::object& data) {
  const std::string name = row.name;
  if (name == "data") data = py::reinterpret_borrow<py::object>(value);
  else if (name == "dtype" && !py::isinstance<py::str>(value)) o.dtype = dtype_name(train_dtype(value));
  else if (name == "spike") for (const std::string& w : spike_words(value)) o.spikes.push_back(w);
  else if (name == "rollback-policy") o.rollback_policy = policy_words(value);
  else if (row.negation && !cast_arg<bool>(value, "train: " + key, "a bool"))
    read_keyword(*option_named(row.negation), key, py::bool_(true), o);
  else return false;
  return true;
}

// belay.train's keywords into the option table's fields (apps/run/train_options.h): the names
// are belay train's long options with '-' as '_'. `data` gets data= as given.
TrainOptions read_train_keywords(const py::kwargs& kw, py::object& data) {
  TrainOptions o;
  for (auto [key_h, value] : kw) {
    const std::string key = py::str(key_h);
    const TrainOption* row = option_of_keyword(key);
    if (!row)
      throw UsageError("train: unknown option '" + key + "' (the options of `belay train --help`, '-' written '_'; "
                       "--in/--out are in_features/out_features; the multi-process options --dist* and --bucket-mb "
                       "are the CLI's alone)");
    o.given.insert(row->name);
    if (!read_python_value(*row, key, value, o, data)) read_keyword(*row, key, value, o);
  }
  return o;
}

// belay.train(**options) as a TrainConfig, through the CLI's one reading of the words.
TrainConfig train_config(const py::kwargs& kw) {
  py::object data = py::none();
  TrainOptions o = read_train_keywords(kw, data);
  TrainConfig c = finish_train_options(o);
  if (py::isinstance<py::str>(data)) c.data = data.cast<std::string>();
  else if (!data.is_none())
    c.make_dataset = array_dataset(data, o.given.count("out") ? std::optional<int64_t>(c.out_features) : std::nullopt);
  return c;
}

// belay.TrainRows: what belay.train returns, the rows as a list (as before token data came)
// with the run's results beside them. Written in Python: a list subclass with attributes.
const char* kTrainRows = R"(
class TrainRows(list):
    """The StepRows of a belay.train run (a list), and on token data (model='gpt'):
    heldout: [(step, held-out loss)] of each evaluation (eval_every=N), in nats per token;
    unigram_entropy: the training text's, in nats per token (the loss a model must beat);
    tokens_per_step: batch x context."""
    heldout = ()
    unigram_entropy = None
    tokens_per_step = 0
)";

py::handle train_rows_type;  // belay.TrainRows; the module keeps it alive

py::list run_rows(const py::list& rows, const TrainResult& result) {
  py::list out = train_rows_type(rows);
  if (result.tokens_per_step == 0) return out;  // not token data: the class's defaults
  py::list heldout;
  for (const auto& [step, loss] : result.heldout) heldout.append(py::make_tuple(step, loss));
  out.attr("heldout") = heldout;
  out.attr("unigram_entropy") = result.unigram_entropy;
  out.attr("tokens_per_step") = result.tokens_per_step;
  return out;
}

// A `belay train` checkpoint's model, by the model-kind table (apps/run/model_kinds.h), for
// belay.load_checkpoint and train(resume=...) in belay/__init__.py.
void bind_model_kinds(py::module_& m) {
  m.def("_model_keywords", [](const Settings& settings, const std::string& path) {
    TrainConfig c;
    read_model_settings(settings, path, c);
    py::dict kw;
    kw["model"] = c.model;
    for (const ShapeField& f : model_kind(c.model).shape) kw[py::str(keyword_of(*option_named(f.name)))] = f.get(c);
    return kw;
  }, py::arg("settings"), py::arg("path"), "The model and shape keywords of belay.train that a checkpoint's settings record");
  m.def("_model_from_settings", [](const Settings& settings, const std::string& path) {
    return model_from_settings(settings, path, Device::cpu());
  }, py::arg("settings"), py::arg("path"), "The model (Linear, Mlp, Gpt, ...) of a checkpoint's settings, unloaded");
}

}  // namespace

void bind_train(py::module_& m) {
  bind_model_kinds(m);
  m.def("_train_config_text", [](py::kwargs kw) {
    py::object data = py::none();
    TrainOptions o = read_train_keywords(kw, data);
    finish_train_options(o);
    if (py::isinstance<py::str>(data)) o.config.data = data.cast<std::string>();
    return train_config_text(o);
  }, "belay.train's keywords as `belay train --print-config` prints the same options");
  // ---- belay train
  py::exec(kTrainRows, m.attr("__dict__"));
  train_rows_type = m.attr("TrainRows");
  train_rows_type.attr("__module__") = "belay";
  m.def("train", [](py::kwargs kw) {
    TrainConfig c = train_config(kw);
    // Ctrl-C: Python's handler only sets a flag while the run holds no GIL. Between steps the
    // run asks (with the GIL) whether a signal handler raised; if so it stops after the step
    // as the CLI does on SIGINT (checkpoint written if asked), and the exception is raised here.
    py::object raised_type, raised_value, raised_trace;  // what the handler raised, if it did
    c.stop_requested = [&]() -> int {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return 0;
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      PyErr_NormalizeException(&type, &value, &trace);
      raised_type = py::reinterpret_steal<py::object>(type);
      raised_value = py::reinterpret_steal<py::object>(value);
      raised_trace = py::reinterpret_steal<py::object>(trace);
      return SIGINT;
    };
    std::ostringstream out;
    TrainResult result;
    {
      py::gil_scoped_release nogil;
      result = Trainer(c, out).run();
    }
    c.stop_requested = nullptr;
    if (!c.quiet) py::print(out.str(), py::arg("end") = "");
    py::list rows;
    for (const StepRow& r : result.rows) rows.append(to_py(r));
    rows = run_rows(rows, result);
    if (raised_type) {  // a KeyboardInterrupt (or what the user's handler raised), with the rows run
      if (raised_value && PyObject_SetAttrString(raised_value.ptr(), "rows", rows.ptr()) != 0) PyErr_Clear();
      PyErr_Restore(raised_type.release().ptr(), raised_value.release().ptr(), raised_trace.release().ptr());
      throw py::error_already_set();
    }
    if (result.exit_code != 0) {  // the skip-rate stop or a stopping rollback: the CLI exits 1
      py::object e = py::handle(error_type())(py::str(result.stop_reason.empty() ? "the run stopped early (exit code " +
                                                                                std::to_string(result.exit_code) + ")"
                                                                          : python_message(result.stop_reason)));
      e.attr("rows") = rows;
      e.attr("exit_code") = result.exit_code;
      PyErr_SetObject(error_type(), e.ptr());
      throw py::error_already_set();
    }
    return rows;
  }, "belay train as a function: the CLI's long options as keywords ('-' as '_'); returns the StepRows "
     "(a belay.TrainRows: a list; with model='gpt' also .heldout, .unigram_entropy and .tokens_per_step). "
     "A run that stops early (max_skip_rate, a stopping rollback) raises belay.Error with the reason, its rows "
     "in .rows; Ctrl-C stops after the step (checkpointing if asked) and raises KeyboardInterrupt, rows in .rows");
}

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
