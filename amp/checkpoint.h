// Checkpoints as library API: one safetensors file with everything a bit-exact resume needs.
// A C++ user, the `belay` CLI, the Python module and the distributed path all call these
// functions. They live in amp/ because a checkpoint is the state of the whole step: the
// masters (autograd's modules), the optimizer state (optim/) and the scaler (amp/), and amp
// is the lowest room that may see all three (docs/design.md's arrows: apps -> amp -> optim,
// autograd -> engine); apps/ keeps only the CLI glue (which run settings to record).
//
// Tensors: the FP32 masters under the model's state-dict names ("weight", "bias",
// "layers.0.weight", ...) and the optimizer state ("optim.<name>.exp_avg", ".exp_avg_sq",
// ".momentum_buffer"). Metadata: the step to run next, the optimizer's applied-step count
// (the LR schedule's position), the scaler state, the data position, the shared random
// streams' states, how rank streams are derived, the CPU path that wrote it, and the
// settings that must match on resume. Floats are stored in hex ("%a") so they come back
// bit for bit. Written atomically (engine/safetensors.h): an error leaves the previous file.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "autograd/modules.h"
#include "engine/safetensors.h"
#include "optim/optimizer.h"

namespace belay {

class Communicator;

inline constexpr const char* kCheckpointFormat = "belay.checkpoint.v1";
// A model file: a model's FP32 weights under its state-dict names and its settings
// ("setting.model", ".width", ...), nothing of a run (belay export, belay import).
inline constexpr const char* kModelFileFormat = "belay.model.v1";

struct RunState {
  int64_t next_step = 0;
  int64_t optimizer_steps = 0;
  ScalerState scaler;
  std::string data_position;
  std::map<std::string, std::string> settings;  // must match when resuming
  // Shared random streams by name (stored as "rng.<name>", 64 hex digits): the state of a
  // generator every rank holds alike (a stream that differs per rank is a rank_stream,
  // engine/random.h, and needs no state here).
  std::map<std::string, std::array<uint64_t, 4>> rng_states;
  // Set when a run resumed under another precision policy (--new-experiment): what changed
  // and from where. Not compared on resume; carried into every later checkpoint.
  std::string experiment;
  // The run's other history, kept across resumes: "record.<step>.<what>" in the metadata
  // (a rollback and what followed it). Keys without the prefix.
  std::map<std::string, std::string> records;
  // What the file carries for readers other than the resume, as "attach.<key>": the tokenizer
  // of the run's text (apps/text/bpe_source.h), which sample and export read. Not compared on
  // resume (the data's own checks are); export_weights keeps them.
  std::map<std::string, std::string> attachments;
  // Filled by load_checkpoint: the precision-policy settings a --new-experiment changed
  // ("dtype fp16 -> bf16"), empty for a plain continuation.
  std::vector<std::string> policy_changes;
  bool scaler_state_loaded = true;  // false when the new experiment turned the scaler on or off
  // A sharded run's layout (ShardPlan::text, amp/dist/shard_plan.h), "shards" in the metadata:
  // for readers. Not read back: a resume makes the plan of its own world size.
  std::string shards;
};

// What a checkpoint holds, read and checked without a model: the file alone.
struct CheckpointInfo {
  RunState state;  // settings: as saved; policy_changes empty
  std::string cpu_isa;  // the CPU kernels' path that wrote it ("" in older files)
  std::map<std::string, std::vector<int64_t>> tensors;  // every tensor's shape, by name
};

// Validates `path` as a belay checkpoint: a readable safetensors file (its checksums
// agree), the format, every metadata field present and well-formed, every tensor F32.
// Throws UsageError naming the file and the first problem (a truncated or corrupt file, a
// file of another kind), so that loading can check a model against it before touching it.
CheckpointInfo inspect_checkpoint(const std::string& path);

// The checkpoint's recorded setting `key` ("" when it has none, as in files written before
// the setting existed). Throws UsageError for a file that is not a belay checkpoint.
std::string checkpoint_setting(const std::string& path, const std::string& key);
// Every setting of it (the keys without "setting."); UsageError if it is not a checkpoint.
std::map<std::string, std::string> checkpoint_settings(const std::string& path);

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

// Atomic: a crash or an error mid-write leaves the previous checkpoint intact.
void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& state);
// The same for a replica of a data-parallel run, called by every rank at the same step:
// the ranks first all-reduce a checksum of their masters and scaler state (state.scaler) (replicas must
// agree bit for bit); on agreement rank 0 alone writes, otherwise every rank throws Error
// and nothing is written. With one process it is save_checkpoint. With sharded optimizer
// state (comm.sharded()) the ranks agree on their parameters' values instead, and each
// master and state tensor goes from its owner to rank 0, which writes the same file.
void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& state,
                     Communicator& comm);
// FNV-1a over the bits of every master and of the scaler state: what save_checkpoint's
// ranks compare.
uint64_t replica_checksum(const Module& model, const ScalerState& scaler);

// Validates everything before changing anything: a bad file or other settings throw
// UsageError naming the file and the problem, and the model and optimizer are untouched.
// `settings`: this run's (check_resume_settings compares them). Every rank of a
// data-parallel run loads the same file itself: any world size dividing the batch.
// `accept` (optional) sees the state once the file is checked and before anything is
// written or warned: the caller's own checks (a dataset's position) throw from there.
RunState load_checkpoint(const std::string& path, Module& model, Optimizer& opt,
                         const std::map<std::string, std::string>& settings, bool new_experiment = false,
                         const std::function<void(const RunState&)>& accept = {});
// --init: initial FP32 weights under the state-dict names; every parameter must be present
// with its shape (F32, F16 or BF16 in the file).
// The SafetensorsFile forms serve a caller that reads the settings and the weights of one file
// (sample, belay.load_model): the file is read once.
// A tensor named in `first_rows` may have more rows than the model's (a GPT trained at a
// shorter context than the file's: wpe's first positions); its first rows are loaded.
void load_initial_weights(const std::string& path, Module& model, const std::set<std::string>& first_rows = {});
void load_initial_weights(const SafetensorsFile& file, Module& model, const std::set<std::string>& first_rows = {});
// The model settings of a checkpoint or a model file (the keys without "setting."); UsageError
// naming the file when it is neither.
std::map<std::string, std::string> model_file_settings(const std::string& path);
std::map<std::string, std::string> model_file_settings(const SafetensorsFile& file);
// `belay export`: the masters of a checkpoint, alone, under their state-dict names, as a model file.
void export_weights(const std::string& checkpoint_path, const std::string& out_path);

}  // namespace belay
