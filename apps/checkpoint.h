// Checkpoints: one safetensors file with everything a bit-exact resume needs. Tensors: the
// FP32 masters under the model's state-dict names ("weight", "bias", "layers.0.weight",
// ...) and the optimizer state ("optim.<name>.exp_avg", ".exp_avg_sq", ".momentum_buffer").
// Metadata: the step to run next, the optimizer's applied-step count (the LR schedule's
// position), the scaler state, the data position, and the settings that must match on
// resume. Floats are stored in hex ("%a") so they come back bit for bit.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "autograd/modules.h"
#include "optim/optimizer.h"

namespace belay {

inline constexpr const char* kCheckpointFormat = "belay.checkpoint.v1";

struct RunState {
  int64_t next_step = 0;
  int64_t optimizer_steps = 0;
  ScalerState scaler;
  std::string data_position;
  std::map<std::string, std::string> settings;  // must match when resuming
  // Set when a run resumed under another precision policy (--new-experiment): what changed
  // and from where. Not compared on resume; carried into every later checkpoint.
  std::string experiment;
  // The run's other history, kept across resumes: "record.<step>.<what>" in the metadata
  // (a rollback and what followed it). Keys without the prefix.
  std::map<std::string, std::string> records;
  // Filled by load_checkpoint: the precision-policy settings a --new-experiment changed
  // ("dtype fp16 -> bf16"), empty for a plain continuation.
  std::vector<std::string> policy_changes;
  bool scaler_state_loaded = true;  // false when the new experiment turned the scaler on or off
};

// The checkpoint's recorded setting `key` ("" when it has none, as in files written before
// the setting existed). Throws UsageError for a file that is not a belay checkpoint.
std::string checkpoint_setting(const std::string& path, const std::string& key);

// Settings that make a precision policy: the dtype, the gradient dtype, loss scaling and
// its options, the ops kept in FP32 (--fp32-ops). Resuming under another policy is a new
// experiment, not a continuation.
bool is_policy_setting(const std::string& key);
// THE resume check: the checkpoint's settings against this run's, every key of either side
// (a key older checkpoints or a caller lack counts as its default: fp32_ops none). A difference outside
// the policy settings is refused (UsageError); a policy difference is refused unless
// new_experiment, and then returned as "key old -> new" lines.
std::vector<std::string> check_resume_settings(const std::string& path, std::map<std::string, std::string> saved,
                                               std::map<std::string, std::string> run, bool new_experiment);

std::string exact_float(float x);                 // "%a"
float parse_exact_float(const std::string& s, const std::string& what);  // throws UsageError

// Atomic: a crash mid-write leaves the previous checkpoint intact.
void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& state);
// Validates everything before changing anything: a bad file or other settings throw
// UsageError naming the file and the problem, and the model and optimizer are untouched.
RunState load_checkpoint(const std::string& path, Module& model, Optimizer& opt,
                         const std::map<std::string, std::string>& settings, bool new_experiment = false);
// --init: initial FP32 weights under the state-dict names; every parameter must be present
// with its shape (F32, F16 or BF16 in the file).
void load_initial_weights(const std::string& path, Module& model);
// `belay export`: the masters of a checkpoint, alone, under their state-dict names.
void export_weights(const std::string& checkpoint_path, const std::string& out_path);

}  // namespace belay
