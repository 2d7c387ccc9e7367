#include "amp/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "amp/dist/communicator.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"
#include "engine/text_fields.h"
#include "engine/whole_lines.h"

namespace belay {

std::string exact_float(float x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(x));
  return buf;
}

float parse_exact_float(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const float f = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0') throw UsageError(what + ": '" + s + "' is not a number");
  return f;
}

static int64_t parse_int(const std::string& s, const std::string& what) {
  const std::optional<int64_t> v = parse_count(s);
  if (!v) throw UsageError(what + ": '" + s + "' is not a count");
  return *v;
}

bool is_policy_setting(const std::string& key) {
  return key == "dtype" || key == "grad_dtype" || key == "fp32_ops" || key == "attention" || key == "scaler" ||
         key.rfind("scaler.", 0) == 0;
}

namespace {
// How a setting reads in a message: as its option where it has one ("--fp32-ops gelu").
std::string setting_text(const std::string& key, const std::string& value) {
  if (key == "dtype" || key == "grad_dtype" || key == "fp32_ops") {
    std::string option = key;
    for (char& ch : option)
      if (ch == '_') ch = '-';
    return "--" + option + " " + value;
  }
  return key + "=" + value;
}
}  // namespace

std::vector<std::string> check_resume_settings(const std::string& path, std::map<std::string, std::string> saved,
                                               std::map<std::string, std::string> run, bool new_experiment) {
  // Settings added after checkpoints were first written, as such a checkpoint (or a caller
  // that does not name them) ran.
  if (!saved.count("fp32_ops")) saved["fp32_ops"] = "none";
  if (!run.count("fp32_ops")) run["fp32_ops"] = "none";
  // A GPT's checkpoint from before the fused attention op ran the three-op path.
  if (run.count("attention") && !saved.count("attention")) saved["attention"] = "naive";
  // ... and from before the tanh GELU, the erf one.
  if (run.count("gelu") && !saved.count("gelu")) saved["gelu"] = "erf";
  std::vector<std::string> policy_changes;
  std::vector<std::string> keys;
  for (auto& [k, v] : saved) keys.push_back(k);
  for (auto& [k, v] : run)
    if (!saved.count(k)) keys.push_back(k);
  for (const std::string& key : keys) {
    const auto a = saved.find(key);
    const auto b = run.find(key);
    const std::string have = a == saved.end() ? "(unset)" : a->second;
    const std::string want = b == run.end() ? "(unset)" : b->second;
    if (have == want) continue;
    if (!is_policy_setting(key))
      throw UsageError("checkpoint '" + path + "' was written with " + key + "=" + have + ", this run has " + key + "=" +
                       want + ": resume with the same settings");
    if (!new_experiment)
      throw UsageError("checkpoint '" + path + "' was written with " + setting_text(key, have) + ", this run has " +
                       setting_text(key, want) + ": another precision policy is a new experiment, not a continuation "
                       "(add --new-experiment to start one from this checkpoint; it is recorded)");
    policy_changes.push_back(key + " " + have + " -> " + want);
  }
  return policy_changes;
}

namespace {

// The file: the tensors as given (the masters, then the optimizer state) and the run's state.
void write_checkpoint(const std::string& path, const NamedTensors& tensors, const RunState& st) {
  std::map<std::string, std::string> meta;
  for (auto& [k, v] : st.settings) meta["setting." + k] = v;
  meta["format"] = kCheckpointFormat;
  meta["next_step"] = std::to_string(st.next_step);
  meta["optimizer_steps"] = std::to_string(st.optimizer_steps);
  meta["scaler.scale"] = exact_float(st.scaler.scale);
  meta["scaler.growth_tracker"] = exact_float(st.scaler.growth_tracker);
  meta["scaler.hysteresis_left"] = exact_float(st.scaler.hysteresis_left);
  meta["data_position"] = st.data_position;
  for (auto& [k, v] : st.records) meta["record." + k] = v;
  for (auto& [k, v] : st.attachments) meta["attach." + k] = v;
  for (auto& [name, words] : st.rng_states) {
    Rng r;
    r.set_state(words);
    meta["rng." + name] = r.state_hex();
  }
  meta["rng_rank_streams"] = kRankStreamDerivation;
  // The CPU kernels' path that wrote it: each path repeats its own bits exactly, but two
  // paths may differ in the last bits (FMA or not in the products), so a resume says so.
  meta["cpu_isa"] = active_cpu_isa_name();
  if (!st.experiment.empty()) meta["experiment"] = st.experiment;
  if (!st.shards.empty()) meta["shards"] = st.shards;
  write_safetensors(path, tensors, meta);
}

// FNV-1a over the bits of each parameter's value (the working copy every rank holds alike
// in a sharded run, where a master is current only on its owner) and of the scaler state.
uint64_t values_checksum(const Module& model, const ScalerState& scaler) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const Var& p : model.parameters()) {
    if (p.value().device() == Device::cpu()) {
      mix(p.value().data(), p.value().nbytes());
    } else {  // a GPU's: its bytes read after the queued work (the all-gather included)
      const Tensor host = p.value().to(Device::cpu());
      mix(host.data(), host.nbytes());
    }
  }
  for (float f : {scaler.scale, scaler.growth_tracker, scaler.hysteresis_left}) mix(&f, sizeof f);
  return h;
}

// A sharded run's checkpoint: every master and state tensor moves from its owner to rank 0,
// which writes the file an unsharded run writes (the same names, order and format), so it
// resumes on any world size, sharded or not. Rank 0 holds the whole state while it writes.
// A gather that fails (a rank died: the deadline) throws before anything is written.
void save_sharded_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& st,
                             Communicator& comm) {
  if (!comm.replicas_agree(values_checksum(model, st.scaler)))
    throw Error("the ranks' parameters or scaler state disagree at step " + std::to_string(st.next_step) +
                "; no checkpoint written");
  const std::vector<int>& owner = comm.shards().owner;
  std::map<const Node*, size_t> index;
  for (size_t i = 0; i < opt.params().size(); ++i) index[opt.params()[i].node()] = i;
  const bool root = comm.rank() == 0;
  NamedTensors tensors;
  auto gathered = [&](const Tensor& mine, const Shape& shape, int from) {
    Tensor t = from == comm.rank() ? mine : root ? Tensor::zeros(shape, DType::F32, Device::cpu()) : Tensor();
    comm.gather_to_root(t, from);
    return t;
  };
  for (auto& [name, p] : model.named_parameters()) {
    // A master is current on its owner only (released elsewhere, or an FP32 value equal to it).
    const Tensor master = gathered(p.master(), p.value().shape(), owner.at(index.at(p.node())));
    if (root) tensors.push_back({name, master});
  }
  std::map<std::string, Tensor*> own;
  for (auto& [name, t] : opt.state_tensors()) own[name] = t;
  for (size_t i = 0; i < opt.params().size(); ++i)
    for (const std::string& name : opt.state_names(i)) {
      const Tensor t = gathered(owner[i] == comm.rank() ? *own.at(name) : Tensor(), opt.params()[i].shape(), owner[i]);
      if (root) tensors.push_back({name, t});
    }
  if (!root) return;
  RunState with_shards = st;
  with_shards.shards = comm.shards().text();
  write_checkpoint(path, tensors, with_shards);
}

}  // namespace

void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& st) {
  NamedTensors tensors;
  for (auto& [name, p] : model.named_parameters()) tensors.push_back({name, p.master()});
  for (auto& [name, t] : opt.state_tensors()) tensors.push_back({name, *t});
  write_checkpoint(path, tensors, st);
}

uint64_t replica_checksum(const Module& model, const ScalerState& scaler) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const Var& p : model.parameters()) {
    const std::vector<float> v = p.master().to_vector();
    mix(v.data(), v.size() * sizeof(float));
  }
  for (float f : {scaler.scale, scaler.growth_tracker, scaler.hysteresis_left}) mix(&f, sizeof f);
  return h;
}

void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& st,
                     Communicator& comm) {
  if (comm.sharded()) return save_sharded_checkpoint(path, model, opt, st, comm);
  // Every rank takes part in the agreement (a collective), then rank 0 writes for all.
  if (!comm.replicas_agree(replica_checksum(model, st.scaler)))
    throw Error("the ranks' weights or scaler state disagree at step " + std::to_string(st.next_step) +
                "; no checkpoint written");
  if (comm.rank() == 0) save_checkpoint(path, model, opt, st);
}

namespace {

// Everything a checkpoint must hold, checked on the parsed file (inspect_checkpoint and
// load_checkpoint share it, so the file is read once per load).
CheckpointInfo inspect_file(const SafetensorsFile& f, const std::string& path) {
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end())
      throw UsageError("checkpoint '" + path + "' has no '" + key + "' in its metadata (not a belay checkpoint?)");
    return it->second;
  };
  if (meta("format") != kCheckpointFormat)
    throw UsageError("checkpoint '" + path + "' has format '" + meta("format") + "', expected " + kCheckpointFormat);
  CheckpointInfo info;
  RunState& st = info.state;
  st.next_step = parse_int(meta("next_step"), "checkpoint '" + path + "' next_step");
  st.optimizer_steps = parse_int(meta("optimizer_steps"), "checkpoint '" + path + "' optimizer_steps");
  st.scaler.scale = parse_exact_float(meta("scaler.scale"), "checkpoint '" + path + "' scaler.scale");
  st.scaler.growth_tracker = parse_exact_float(meta("scaler.growth_tracker"), "checkpoint '" + path + "' scaler");
  st.scaler.hysteresis_left = parse_exact_float(meta("scaler.hysteresis_left"), "checkpoint '" + path + "' scaler");
  st.data_position = meta("data_position");
  for (auto& [k, v] : f.metadata()) {
    if (k.rfind("setting.", 0) == 0) st.settings[k.substr(8)] = v;
    if (k.rfind("record.", 0) == 0) st.records[k.substr(7)] = v;
    if (k.rfind("attach.", 0) == 0) st.attachments[k.substr(7)] = v;
    if (k.rfind("rng.", 0) == 0) {
      Rng r;
      if (!r.set_state_hex(v))
        throw UsageError("checkpoint '" + path + "': random stream '" + k.substr(4) + "' is not 64 hex digits");
      st.rng_states[k.substr(4)] = r.state();
    }
  }
  if (auto it = f.metadata().find("experiment"); it != f.metadata().end()) st.experiment = it->second;
  if (auto it = f.metadata().find("cpu_isa"); it != f.metadata().end()) info.cpu_isa = it->second;
  // Older files lack the key: they were written before any rank stream was drawn.
  if (auto it = f.metadata().find("rng_rank_streams"); it != f.metadata().end() && it->second != kRankStreamDerivation)
    throw UsageError("checkpoint '" + path + "' derives its per-rank random streams as '" + it->second +
                     "', this belay as '" + kRankStreamDerivation + "': a resume would not draw the same numbers");
  for (const SafetensorsEntry& e : f.entries()) {
    if (e.dtype != "F32")
      throw UsageError("checkpoint '" + path + "': tensor '" + e.name + "' is " + e.dtype + ", expected F32");
    info.tensors[e.name] = e.shape;
  }
  return info;
}

}  // namespace

CheckpointInfo inspect_checkpoint(const std::string& path) { return inspect_file(read_safetensors(path), path); }

RunState load_checkpoint(const std::string& path, Module& model, Optimizer& opt,
                         const std::map<std::string, std::string>& settings, bool new_experiment,
                         const std::function<void(const RunState&)>& accept) {
  const SafetensorsFile f = read_safetensors(path);
  const CheckpointInfo info = inspect_file(f, path);
  const std::map<std::string, std::string>& saved = info.state.settings;
  const std::vector<std::string> policy_changes = check_resume_settings(path, saved, settings, new_experiment);
  // Check every tensor the model and the optimizer need before touching anything.
  std::vector<std::pair<const SafetensorsEntry*, Tensor*>> plan;
  auto expect = [&](const std::string& name, Tensor& dst) {
    if (!f.contains(name)) throw UsageError("checkpoint '" + path + "' has no tensor '" + name + "'");
    const SafetensorsEntry& e = f.entry(name);
    if (Shape(e.shape) != dst.shape())
      throw UsageError("checkpoint '" + path + "': tensor '" + name + "' has shape " + Shape(e.shape).str() +
                       ", the model needs " + dst.shape().str());
    plan.push_back({&e, &dst});
  };
  std::vector<Var> params;
  // A released master (sharded optimizer state: another rank owns it) is read into a
  // temporary and rounded into the working copy, which is all this rank keeps of it.
  const auto named = model.named_parameters();
  std::vector<std::pair<Var, Tensor>> released;
  released.reserve(named.size());  // expect() keeps pointers to its tensors
  for (auto& [name, p] : named) {
    if (p.master_released()) {
      released.push_back({p, Tensor::empty(p.value().shape(), DType::F32, Device::cpu())});
      expect(name, released.back().second);
      continue;
    }
    expect(name, const_cast<Tensor&>(p.master()));
    params.push_back(p);
  }
  for (auto& [name, t] : opt.state_tensors()) expect(name, *t);
  RunState st = info.state;
  st.settings = settings;
  st.policy_changes = policy_changes;
  // Loss scaling turned on or off: the saved scale belongs to the other policy.
  auto scaler_on = [](const std::map<std::string, std::string>& m) {
    auto it = m.find("scaler");
    return it != m.end() && it->second == "1";
  };
  st.scaler_state_loaded = scaler_on(saved) == scaler_on(settings);
  if (accept) accept(st);  // the caller's own checks (the data position), still before any write
  // All checked: a warning, if any, and then the copy (a refused file says one line only).
  if (!info.cpu_isa.empty() && info.cpu_isa != active_cpu_isa_name())
    print_line(std::cerr, "belay: warning: checkpoint '" + path + "' was written by the " + info.cpu_isa +
                              " CPU path, this run uses " + active_cpu_isa_name() +
                              ": the run continues, but not bit for bit as it would have on " + info.cpu_isa +
                              " (--cpu-isa chooses the path)");
  for (auto& [e, dst] : plan) dst->copy_from(f.tensor(e->name));
  for (Var& p : params) p.set_working_dtype(p.dtype());  // the working copy is the rounded master
  for (auto& [p, master] : released) p.node()->value.copy_from(master.to(p.dtype()));
  opt.set_step_count(st.optimizer_steps);
  return st;
}

namespace {

// The keys without "setting.".
std::map<std::string, std::string> recorded_settings(const SafetensorsFile& f) {
  std::map<std::string, std::string> settings;
  const std::string prefix = "setting.";
  for (const auto& [key, value] : f.metadata())
    if (key.compare(0, prefix.size(), prefix) == 0) settings[key.substr(prefix.size())] = value;
  return settings;
}

std::string file_format(const SafetensorsFile& f) {
  const auto format = f.metadata().find("format");
  return format == f.metadata().end() ? "" : format->second;
}

}  // namespace

std::map<std::string, std::string> checkpoint_settings(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  if (file_format(f) != kCheckpointFormat) throw UsageError("'" + path + "' is not a belay checkpoint");
  return recorded_settings(f);
}

std::string checkpoint_setting(const std::string& path, const std::string& key) {
  const std::map<std::string, std::string> settings = checkpoint_settings(path);
  auto it = settings.find(key);
  return it == settings.end() ? "" : it->second;
}

namespace {

// The first rows of `name` when the file has at least the model's and the same row width, else
// the whole tensor (which weight() then refuses by its shape).
Tensor first_rows_weight(const SafetensorsFile& f, const std::string& name, const Shape& need) {
  if (!f.contains(name) || need.rank() == 0) return f.weight(name, need, "the model needs");
  const Shape has(f.entry(name).shape);
  bool wider = has.rank() == need.rank() && has[0] >= need[0];
  for (size_t i = 1; wider && i < need.rank(); ++i) wider = has[i] == need[i];
  if (!wider) return f.weight(name, need, "the model needs");
  const std::vector<float> all = f.weight(name, has, "the model needs").to_vector();
  return Tensor::from_vector(std::vector<float>(all.begin(), all.begin() + need.numel()), need);
}

}  // namespace

void load_initial_weights(const SafetensorsFile& f, Module& model, const std::set<std::string>& first_rows) {
  std::vector<std::pair<Var, Tensor>> loaded;
  for (auto& [name, p] : model.named_parameters())
    loaded.push_back({p, first_rows.count(name) ? first_rows_weight(f, name, p.shape())
                                                : f.weight(name, p.shape(), "the model needs")});
  for (auto& [p, t] : loaded) {
    const_cast<Tensor&>(p.master()).copy_from(t);
    Var(p).set_working_dtype(p.dtype());
  }
}

void load_initial_weights(const std::string& path, Module& model, const std::set<std::string>& first_rows) {
  load_initial_weights(read_safetensors(path), model, first_rows);
}

std::map<std::string, std::string> model_file_settings(const SafetensorsFile& f) {
  const std::string format = file_format(f);
  if (format != kCheckpointFormat && format != kModelFileFormat)
    throw UsageError("'" + f.source() + "' is neither a belay checkpoint nor a model file (belay import, belay export)");
  return recorded_settings(f);
}

std::map<std::string, std::string> model_file_settings(const std::string& path) {
  return model_file_settings(read_safetensors(path));
}

void export_weights(const std::string& checkpoint_path, const std::string& out_path) {
  const SafetensorsFile f = read_safetensors(checkpoint_path);
  auto it = f.metadata().find("format");
  if (it == f.metadata().end() || it->second != kCheckpointFormat)
    throw UsageError("'" + checkpoint_path + "' is not a belay checkpoint");
  NamedTensors weights;
  for (const std::string& name : f.names())
    if (name.rfind("optim.", 0) != 0) weights.push_back({name, f.tensor(name)});
  std::map<std::string, std::string> meta;
  for (auto& [k, v] : f.metadata())
    if (k.rfind("setting.", 0) == 0 || k.rfind("attach.", 0) == 0) meta[k] = v;
  meta["exported_from"] = checkpoint_path;
  meta["format"] = kModelFileFormat;
  write_safetensors(out_path, weights, meta);
}

}  // namespace belay
