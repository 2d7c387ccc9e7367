// The models `belay train --model NAME` builds, as one table: for each kind, the options it
// takes, its checks and defaults, its parameter count, how it is built, and the shape it
// writes into a checkpoint's settings and reads back. train, validate, sample, accum-check,
// the CLI and the Python module all ask this table; none compares a model's name itself.
// A new kind is one more row in kModelKinds (apps/run/model_kinds.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/device.h"

namespace belay {

struct TrainConfig;
class Module;
class Rng;

using Settings = std::map<std::string, std::string>;

// One size of a model's shape: the option `--NAME` that sets it and the checkpoint setting
// NAME that records it, read and written through the config.
struct ShapeField {
  const char* name;  // "width": --width, settings["width"]
  int64_t (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, int64_t);
  // A value below an --init file's may be given when this names the one tensor it sizes: the
  // file's first rows are loaded (a GPT's --context: wpe's first positions, as a shorter input
  // uses them). nullptr: the size must be the file's.
  const char* shorter_takes_first_rows_of = nullptr;
};

// A default that a kind gives an option the user did not give (by its option name).
struct KindDefault {
  const char* option;  // "lr"
  void (*apply)(TrainConfig&);
};

struct ModelKind {
  const char* name;  // --model NAME
  const char* note;  // what --help says of it, or nullptr
  // The sizes it is built from, each an option and a checkpoint setting ("in" and "out" are
  // recorded for every kind: for token data they are the context and the vocabulary).
  std::vector<ShapeField> shape;
  // Its options that are not sizes (a GPT's held-out evaluation).
  std::vector<const char*> other_options;
  bool token_data;        // trains on a tokens file (--data), not on rows of x and y
  bool class_labels;      // can train on class labels (cross-entropy on its outputs)
  std::vector<KindDefault> defaults;
  void (*check)(const TrainConfig&);  // its own checks (UsageError naming the option)
  double (*parameter_count)(const TrainConfig&);
  std::unique_ptr<Module> (*build)(const TrainConfig&, Rng&, Device);
};

// Every kind, in the order --help lists them.
const std::vector<ModelKind>& model_kinds();
// The kind named `name`, or nullptr.
const ModelKind* find_model_kind(const std::string& name);
// The kind named `name`; UsageError "unknown model 'x': use linear, mlp or gpt" otherwise.
const ModelKind& model_kind(const std::string& name);
// "linear, mlp or gpt": the names, as a message lists them (those that pass `keep`).
std::string model_kind_names(bool (*keep)(const ModelKind&) = nullptr);
inline bool takes_tokens(const ModelKind& k) { return k.token_data; }
inline bool takes_rows(const ModelKind& k) { return !k.token_data; }
inline bool takes_labels(const ModelKind& k) { return k.class_labels; }

// The options some kind takes and others do not (every kind's shape and other options).
const std::set<std::string>& model_options();
// Whether `option` (a name without dashes: "hidden") is one of kind's.
bool takes_option(const ModelKind& kind, const std::string& option);
// UsageError for the first option in `given` (names without dashes) that some kind takes and
// `kind` does not, naming both: "--in is not an option of --model gpt (its options: ...)".
// (The Python module rewrites option names in messages as keywords.)
void check_given_options(const ModelKind& kind, const std::set<std::string>& given);
// The defaults of c.model's kind for the options not in `given`; a warmup the kind chose is
// cut to a tenth of a run shorter than it, and dropped under a schedule without one.
void apply_kind_defaults(TrainConfig& c, const std::set<std::string>& given);

// --init of a checkpoint or a model file (belay import): the model kind, its sizes and its GELU
// come from the file for the options not in `given`; one given that differs is refused
// (UsageError naming both). A file of weights alone changes nothing.
void apply_init_settings(TrainConfig& c, const std::set<std::string>& given);
// The tensors whose first rows --init loads (the kind's shorter_takes_first_rows_of).
std::set<std::string> first_rows_tensors(const TrainConfig& c);
// The shape into a checkpoint's settings: "model", "in", "out" and the kind's sizes.
void write_model_settings(const TrainConfig& c, Settings& settings);
// The shape back from them into `c` (model, in, out and the kind's sizes); UsageError naming
// the file and the first setting that is missing or not a positive integer.
void read_model_settings(const Settings& settings, const std::string& path, TrainConfig& c);
// The model those settings describe, checked as its kind checks it and built on `device`
// with any init (the caller loads every parameter): sample and the Python module's
// load_checkpoint rebuild a run's model with it.
std::unique_ptr<Module> model_from_settings(const Settings& settings, const std::string& path, Device device);

}  // namespace belay
