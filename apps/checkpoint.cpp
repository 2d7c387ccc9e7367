#include "apps/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/safetensors.h"

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
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0) throw UsageError(what + ": '" + s + "' is not a count");
  return v;
}

void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const RunState& st) {
  NamedTensors tensors;
  for (auto& [name, p] : model.named_parameters()) tensors.push_back({name, p.master()});
  for (auto& [name, t] : opt.state_tensors()) tensors.push_back({name, *t});
  std::map<std::string, std::string> meta;
  for (auto& [k, v] : st.settings) meta["setting." + k] = v;
  meta["format"] = kCheckpointFormat;
  meta["next_step"] = std::to_string(st.next_step);
  meta["optimizer_steps"] = std::to_string(st.optimizer_steps);
  meta["scaler.scale"] = exact_float(st.scaler.scale);
  meta["scaler.growth_tracker"] = exact_float(st.scaler.growth_tracker);
  meta["scaler.hysteresis_left"] = exact_float(st.scaler.hysteresis_left);
  meta["data_position"] = st.data_position;
  // The CPU kernels' path that wrote it: each path repeats its own bits exactly, but two
  // paths may differ in the last bits (FMA or not in the products), so a resume says so.
  meta["cpu_isa"] = active_cpu_isa_name();
  if (!st.experiment.empty()) meta["experiment"] = st.experiment;
  write_safetensors(path, tensors, meta);
}

RunState load_checkpoint(const std::string& path, Module& model, Optimizer& opt,
                         const std::map<std::string, std::string>& settings) {
  const SafetensorsFile f = read_safetensors(path);
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end())
      throw UsageError("checkpoint '" + path + "' has no '" + key + "' in its metadata (not a belay checkpoint?)");
    return it->second;
  };
  if (meta("format") != kCheckpointFormat)
    throw UsageError("checkpoint '" + path + "' has format '" + meta("format") + "', expected " + kCheckpointFormat);
  for (auto& [key, want] : settings) {
    const std::string& have = meta("setting." + key);
    if (have != want)
      throw UsageError("checkpoint '" + path + "' was written with " + key + "=" + have + ", this run has " + key +
                       "=" + want + ": resume with the same settings");
  }
  if (auto it = f.metadata().find("cpu_isa"); it != f.metadata().end() && it->second != active_cpu_isa_name())
    std::cerr << "belay: warning: checkpoint '" << path << "' was written by the " << it->second
              << " CPU path, this run uses " << active_cpu_isa_name()
              << ": the run continues, but not bit for bit as it would have on " << it->second
              << " (--cpu-isa chooses the path)\n";
  // Check every tensor before touching anything.
  std::vector<std::pair<const SafetensorsEntry*, Tensor*>> plan;
  auto expect = [&](const std::string& name, Tensor& dst) {
    if (!f.contains(name)) throw UsageError("checkpoint '" + path + "' has no tensor '" + name + "'");
    const SafetensorsEntry& e = f.entry(name);
    if (e.dtype != "F32")
      throw UsageError("checkpoint '" + path + "': tensor '" + name + "' is " + e.dtype + ", expected F32");
    if (Shape(e.shape) != dst.shape())
      throw UsageError("checkpoint '" + path + "': tensor '" + name + "' has shape " + Shape(e.shape).str() +
                       ", the model needs " + dst.shape().str());
    plan.push_back({&e, &dst});
  };
  std::vector<Var> params;
  for (auto& [name, p] : model.named_parameters()) {
    expect(name, const_cast<Tensor&>(p.master()));
    params.push_back(p);
  }
  for (auto& [name, t] : opt.state_tensors()) expect(name, *t);
  RunState st;
  st.next_step = parse_int(meta("next_step"), "checkpoint '" + path + "' next_step");
  st.optimizer_steps = parse_int(meta("optimizer_steps"), "checkpoint '" + path + "' optimizer_steps");
  st.scaler.scale = parse_exact_float(meta("scaler.scale"), "checkpoint '" + path + "' scaler.scale");
  st.scaler.growth_tracker = parse_exact_float(meta("scaler.growth_tracker"), "checkpoint '" + path + "' scaler");
  st.scaler.hysteresis_left = parse_exact_float(meta("scaler.hysteresis_left"), "checkpoint '" + path + "' scaler");
  st.data_position = meta("data_position");
  if (auto it = f.metadata().find("experiment"); it != f.metadata().end()) st.experiment = it->second;
  st.settings = settings;
  // All checked: now copy.
  for (auto& [e, dst] : plan) dst->copy_from(f.tensor(e->name));
  for (Var& p : params) p.set_working_dtype(p.dtype());  // the working copy is the rounded master
  opt.set_step_count(st.optimizer_steps);
  return st;
}

std::string checkpoint_setting(const std::string& path, const std::string& key) {
  const SafetensorsFile f = read_safetensors(path);
  auto format = f.metadata().find("format");
  if (format == f.metadata().end() || format->second != kCheckpointFormat)
    throw UsageError("'" + path + "' is not a belay checkpoint");
  auto it = f.metadata().find("setting." + key);
  return it == f.metadata().end() ? "" : it->second;
}

void load_initial_weights(const std::string& path, Module& model) {
  const SafetensorsFile f = read_safetensors(path);
  std::vector<std::pair<Var, Tensor>> loaded;
  for (auto& [name, p] : model.named_parameters()) {
    if (!f.contains(name)) throw UsageError("init file '" + path + "' has no tensor '" + name + "'");
    const SafetensorsEntry& e = f.entry(name);
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
      throw UsageError("init file '" + path + "': tensor '" + name + "' is " + e.dtype + "; use F32, F16 or BF16");
    if (Shape(e.shape) != p.shape())
      throw UsageError("init file '" + path + "': tensor '" + name + "' has shape " + Shape(e.shape).str() +
                       ", the model needs " + p.shape().str());
    const Tensor t = f.tensor(name);
    for (float v : t.to_vector())
      if (!std::isfinite(v)) throw UsageError("init file '" + path + "': tensor '" + name + "' has a non-finite value");
    loaded.push_back({p, t});
  }
  for (auto& [p, t] : loaded) {
    const_cast<Tensor&>(p.master()).copy_from(t);
    Var(p).set_working_dtype(p.dtype());
  }
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
    if (k.rfind("setting.", 0) == 0) meta[k] = v;
  meta["exported_from"] = checkpoint_path;
  write_safetensors(out_path, weights, meta);
}

}  // namespace belay
