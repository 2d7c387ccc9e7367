// `belay train`'s options as one table, read by both front ends: the CLI makes its CLI11
// options from it (apps/cli/cli_train.cpp) and the Python module reads belay.train's
// keywords through it (apps/python/bind_train.cpp). Each row is a name, the field its value
// lands in, the help line and a few traits; the options a user writes as words (dtypes,
// modes, faults) land as words and are read once, by finish_train_options.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "apps/run/train.h"

namespace belay {

// What the options fill, before the words among them are read into the config.
struct TrainOptions {
  TrainConfig config;  // the numbers, paths and switches that need no reading
  std::string dtype = "fp32", grad_dtype = "fp32", clip_mode = "norm", fp32_ops, scenario;
  std::vector<int64_t> inject;
  std::vector<std::string> spikes, rollback_on, rollback_policy;
  bool no_scaler = false, scaler_on = false, unfused = false;
  // Data parallelism: the CLI's alone (the Python module runs one process).
  std::string dist = "local";
  double bucket_mb = 25.0, dist_timeout = 300.0;
  bool progress_thread = false;
  bool print_config = false;  // --print-config: print them (train_config_text) and exit
  // The options given, by name ("weight-decay"): kind defaults and kind checks read them.
  std::set<std::string> given;
};

// Where an option's value lands, by its type: a number, a word, a switch (bool: a flag),
// or a list (repeatable, or comma-separated where the row says so).
using OptionField = std::variant<int64_t& (*)(TrainOptions&), int& (*)(TrainOptions&), uint64_t& (*)(TrainOptions&),
                                 float& (*)(TrainOptions&), double& (*)(TrainOptions&), std::string& (*)(TrainOptions&),
                                 bool& (*)(TrainOptions&), std::vector<int64_t>& (*)(TrainOptions&),
                                 std::vector<std::string>& (*)(TrainOptions&)>;

enum OptionTrait : unsigned {
  kShowDefault = 1,  // --help shows the default
  kCliOnly = 2,      // not a keyword of belay.train (multi-process, scenarios)
  kCommaList = 4,    // a list that also takes "a,b"
  kOneOrTwo = 8,     // one or two words ("lower-lr 0.1")
};

struct TrainOption {
  const char* name;  // "weight-decay": --weight-decay, and belay.train(weight_decay=...)
  OptionField field;
  std::string help;
  unsigned traits = 0;
  const char* keyword = nullptr;  // the Python keyword where it is not the name with '_' ("in_features")
  const char* negation = nullptr;  // a flag whose keyword False means another flag ("scaler" -> "no-scaler")
};

// Every option, in the order --help lists them.
const std::vector<TrainOption>& train_options();
// Python's keyword for it: `keyword`, else the name with '-' as '_'.
std::string keyword_of(const TrainOption& option);
// The option of a Python keyword (its keyword or its name with '_'), or nullptr; CLI-only
// options are not keywords.
const TrainOption* option_of_keyword(const std::string& keyword);
const TrainOption* option_named(const std::string& name);
bool is_flag(const TrainOption& option);

// The words read into the config, the given options recorded and the model kind's defaults
// applied: the TrainConfig the run takes (data parallelism aside: the CLI's). Throws
// UsageError naming the first bad word, with the option as the CLI spells it (the Python
// module rewrites "--grad-dtype" as "grad_dtype").
TrainConfig finish_train_options(TrainOptions& options);

// Every option as the run takes it, a line each ("lr=0.003"; words as given, lists joined by
// ','), once finish_train_options has run: what `belay train --print-config` prints and
// what belay.train's keywords give, the same text for the same options.
std::string train_config_text(TrainOptions& finished);

}  // namespace belay
