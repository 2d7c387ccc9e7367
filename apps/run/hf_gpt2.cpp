// Hugging Face GPT-2 in and out (apps/run/hf_gpt2.h): the config's fields, the names, the
// Conv1D transposes and the c_attn split, each checked before anything is written.
#include "apps/run/hf_gpt2.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "amp/checkpoint.h"
#include "apps/run/model_kinds.h"
#include "apps/run/token_dataset.h"
#include "apps/run/train.h"
#include "engine/atomic_file.h"
#include "engine/error.h"

namespace belay {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// ---- config.json -------------------------------------------------------------------------

json read_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("'" + path + "' cannot be read: a Hugging Face GPT-2 directory has config.json");
  try {
    json config = json::parse(in);
    if (!config.is_object()) throw UsageError("'" + path + "' is not a JSON object");
    return config;
  } catch (const json::exception& e) {
    throw UsageError("'" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

// A positive integer field, required.
int64_t config_count(const json& config, const std::string& path, const char* field) {
  const auto it = config.find(field);
  if (it == config.end()) throw UsageError("'" + path + "' has no " + field);
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    throw UsageError("'" + path + "': " + field + " must be a positive integer, got " + it->dump());
  return it->get<int64_t>();
}

// A boolean field that belay supports at one value only; absent counts as HF's default.
void require_flag(const json& config, const std::string& path, const char* field, bool supported, bool fallback,
                  const char* why) {
  const auto it = config.find(field);
  const bool value = it == config.end() || it->is_null() ? fallback : it->is_boolean() && it->get<bool>();
  if (it != config.end() && !it->is_null() && !it->is_boolean())
    throw UsageError("'" + path + "': " + field + " must be true or false, got " + it->dump());
  if (value != supported)
    throw UsageError("'" + path + "': " + field + " " + (value ? "true" : "false") + " is not supported by belay (" +
                     why + ")");
}

// GPT-2's activation names: gelu_new (GPT-2's own) and gelu_pytorch_tanh are the tanh form,
// gelu is erf.
std::string config_gelu(const json& config, const std::string& path) {
  const auto it = config.find("activation_function");
  const std::string name = it == config.end() ? "gelu_new" : it->is_string() ? it->get<std::string>() : it->dump();
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return "tanh";
  if (name == "gelu") return "erf";
  throw UsageError("'" + path + "': activation_function " + name +
                   " is not supported by belay (gelu_new, gelu_pytorch_tanh or gelu)");
}

void check_config_fields(const json& config, const std::string& path, int64_t width) {
  const auto type = config.find("model_type");
  if (type == config.end() || !type->is_string() || type->get<std::string>() != "gpt2")
    throw UsageError("'" + path + "': model_type is " + (type == config.end() ? std::string("missing") : type->dump()) +
                     ", belay imports gpt2 only");
  const auto eps = config.find("layer_norm_epsilon");
  if (eps != config.end() && !(eps->is_number() && static_cast<float>(eps->get<double>()) == 1e-5f))
    throw UsageError("'" + path + "': layer_norm_epsilon " + eps->dump() + " is not supported by belay (1e-5 only)");
  const auto inner = config.find("n_inner");
  if (inner != config.end() && !inner->is_null() && !(inner->is_number_integer() && inner->get<int64_t>() == 4 * width))
    throw UsageError("'" + path + "': n_inner " + inner->dump() + " is not supported by belay (4 n_embd, or null)");
  require_flag(config, path, "tie_word_embeddings", true, true, "its head is tied to wte: an untied head");
  require_flag(config, path, "scale_attn_weights", true, true, "it always scales attention by 1/sqrt(head size)");
  require_flag(config, path, "scale_attn_by_inverse_layer_idx", false, false, "no per-layer attention scale");
  require_flag(config, path, "reorder_and_upcast_attn", false, false, "its attention has one order of operations");
  require_flag(config, path, "add_cross_attention", false, false, "a decoder-only GPT has no cross-attention");
}

// The settings of the GPT the config describes, checked by the model-kind table.
std::map<std::string, std::string> settings_from_config(const json& config, const std::string& path) {
  TrainConfig c;
  c.model = "gpt";
  c.layers = static_cast<int>(config_count(config, path, "n_layer"));
  c.heads = config_count(config, path, "n_head");
  c.width = config_count(config, path, "n_embd");
  c.context = config_count(config, path, "n_positions");
  c.out_features = config_count(config, path, "vocab_size");
  c.in_features = c.context;
  c.gelu = config_gelu(config, path);
  check_config_fields(config, path, c.width);
  try {
    model_kind(c.model).check(c);
  } catch (const UsageError& e) {
    throw UsageError("'" + path + "': " + e.what());
  }
  Settings settings;
  write_model_settings(c, settings);
  return settings;
}

// ---- the weights -------------------------------------------------------------------------

int64_t setting(const std::map<std::string, std::string>& s, const char* key) { return std::stoll(s.at(key)); }

// a [rows, cols] row-major matrix as [cols, rows].
std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

// Columns [first, first + count) of a [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t first, int64_t count) {
  std::vector<float> out(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < count; ++c) out[r * count + c] = a[r * cols + first + c];
  return out;
}

// The tensors of a transformers GPT-2 file, looked up with or without "transformer.".
class HfTensors {
 public:
  HfTensors(const std::string& path) : file_(read_safetensors(path)), path_(path) {
    prefix_ = file_.contains("transformer.wte.weight") ? "transformer." : "";
  }

  // The tensor's values (FP32), after checking its dtype, its shape and that every value is finite.
  std::vector<float> get(const std::string& name, const Shape& shape, const char* config_says) {
    const std::string full = prefix_ + name;
    std::vector<float> v = file_.weight(full, shape, std::string("config.json's ") + config_says + " need").to_vector();
    used_.insert(full);
    return v;
  }

  // The tied head: an lm_head.weight, when present, must be wte itself.
  void check_tied_head(const std::vector<float>& wte) {
    if (!file_.contains("lm_head.weight")) return;
    const Tensor head = file_.tensor("lm_head.weight");
    if (head.to_vector() != wte)
      throw UsageError("'" + path_ + "': lm_head.weight differs from wte.weight: an untied head, which belay's GPT "
                       "does not have");
    used_.insert("lm_head.weight");
  }

  // Anything left must be one of the causal-mask buffers older files carry (attn.bias,
  // attn.masked_bias: constants belay's attention computes, not weights).
  void check_nothing_else() const {
    for (const std::string& name : file_.names()) {
      if (used_.count(name)) continue;
      const bool mask = name.size() > 10 && (name.compare(name.size() - 10, 10, ".attn.bias") == 0 ||
                                             (name.size() > 17 && name.compare(name.size() - 17, 17, ".attn.masked_bias") == 0));
      if (!mask)
        throw UsageError("'" + path_ + "': tensor '" + name + "' is not part of GPT-2 as belay reads it");
    }
  }

 private:
  SafetensorsFile file_;
  std::string path_, prefix_;
  std::set<std::string> used_;
};

void add(NamedTensors& out, const std::string& name, const std::vector<float>& v, const Shape& shape) {
  out.push_back({name, Tensor::from_vector(v, shape)});
}

// One block: c_attn split into q, k, v, and every Conv1D weight turned to [out, in].
void read_block(HfTensors& hf, int64_t i, int64_t d, NamedTensors& out) {
  const std::string h = "h." + std::to_string(i) + ".", b = "blocks." + std::to_string(i) + ".";
  for (const char* ln : {"ln_1", "ln_2"}) {
    add(out, b + ln + ".weight", hf.get(h + ln + ".weight", Shape{d}, "n_embd"), Shape{d});
    add(out, b + ln + ".bias", hf.get(h + ln + ".bias", Shape{d}, "n_embd"), Shape{d});
  }
  const std::vector<float> qkv_w = hf.get(h + "attn.c_attn.weight", Shape{d, 3 * d}, "n_embd");
  const std::vector<float> qkv_b = hf.get(h + "attn.c_attn.bias", Shape{3 * d}, "n_embd");
  const char* parts[] = {"q", "k", "v"};
  for (int p = 0; p < 3; ++p) {
    add(out, b + "attn." + parts[p] + ".weight", transposed(columns(qkv_w, d, 3 * d, p * d, d), d, d), Shape{d, d});
    add(out, b + "attn." + parts[p] + ".bias", std::vector<float>(qkv_b.begin() + p * d, qkv_b.begin() + (p + 1) * d),
        Shape{d});
  }
  struct Projection { const char* hf; const char* belay; int64_t in, out; };
  for (const Projection& p : {Projection{"attn.c_proj", "attn.proj", d, d}, Projection{"mlp.c_fc", "mlp.fc", d, 4 * d},
                              Projection{"mlp.c_proj", "mlp.proj", 4 * d, d}}) {
    add(out, b + p.belay + ".weight", transposed(hf.get(h + p.hf + ".weight", Shape{p.in, p.out}, "n_embd"), p.in, p.out),
        Shape{p.out, p.in});
    add(out, b + p.belay + ".bias", hf.get(h + p.hf + ".bias", Shape{p.out}, "n_embd"), Shape{p.out});
  }
}

}  // namespace

HfGpt2 read_hf_gpt2(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string weights_path = (fs::path(dir) / "model.safetensors").string();
  if (!fs::is_directory(dir)) throw UsageError("'" + dir + "' is not a directory: give a Hugging Face GPT-2 directory");
  if (!fs::exists(weights_path))
    throw UsageError("'" + dir + "' has no model.safetensors" +
                     (fs::exists(fs::path(dir) / "model.safetensors.index.json") ? std::string(" (a sharded model: belay reads one file)")
                      : fs::exists(fs::path(dir) / "pytorch_model.bin") ? std::string(" (only pytorch_model.bin: save it with safe_serialization=True)")
                                                                         : std::string()));
  const json config = read_config(config_path);
  HfGpt2 m;
  m.settings = settings_from_config(config, config_path);
  for (const char* drop : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
    if (config.contains(drop) && config[drop].is_number() && config[drop].get<double>() != 0.0)
      m.notes.push_back(std::string(drop) + " " + config[drop].dump() + " ignored: belay's GPT has no dropout");

  const int64_t d = setting(m.settings, "width"), v = setting(m.settings, "out"), c = setting(m.settings, "context");
  HfTensors hf(weights_path);
  const std::vector<float> wte = hf.get("wte.weight", Shape{v, d}, "vocab_size and n_embd");
  hf.check_tied_head(wte);
  add(m.weights, "wte.weight", wte, Shape{v, d});
  add(m.weights, "wpe.weight", hf.get("wpe.weight", Shape{c, d}, "n_positions and n_embd"), Shape{c, d});
  for (int64_t i = 0; i < setting(m.settings, "layers"); ++i) read_block(hf, i, d, m.weights);
  add(m.weights, "ln_f.weight", hf.get("ln_f.weight", Shape{d}, "n_embd"), Shape{d});
  add(m.weights, "ln_f.bias", hf.get("ln_f.bias", Shape{d}, "n_embd"), Shape{d});
  hf.check_nothing_else();
  const fs::path d_path(dir);
  if (fs::exists(d_path / "tokenizer.json") || (fs::exists(d_path / "vocab.json") && fs::exists(d_path / "merges.txt"))) {
    m.tokenizer = std::make_shared<const BpeTokenizer>(BpeTokenizer::from_directory(dir));
    if (m.tokenizer->vocab_size() != v)
      throw UsageError("'" + dir + "': its tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                       " tokens, config.json's vocab_size is " + std::to_string(v));
  }
  return m;
}

void write_model_file(const std::string& out, const HfGpt2& model, const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> meta = extra;
  meta["format"] = kModelFileFormat;
  for (const auto& [k, v] : model.settings) meta["setting." + k] = v;
  if (model.tokenizer) meta[kAttachedBpeMetadataKey] = model.tokenizer->serialized();
  write_safetensors(out, model.weights, meta);
}

namespace {

// A [rows, count] block into columns [first, first + count) of a [rows, cols] matrix (c_attn from q, k, v).
void put_columns(std::vector<float>& a, int64_t rows, int64_t cols, int64_t first, const std::vector<float>& block,
                 int64_t count) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < count; ++c) a[r * cols + first + c] = block[r * count + c];
}

class BelayTensors {
 public:
  explicit BelayTensors(const std::string& path) : file_(read_safetensors(path)), path_(path) {}
  std::vector<float> get(const std::string& name, const Shape& shape) const {
    return file_.weight(name, shape, "its settings need").to_vector();
  }
  const SafetensorsFile& file() const { return file_; }

 private:
  SafetensorsFile file_;
  std::string path_;
};

void write_block(const BelayTensors& in, int64_t i, int64_t d, NamedTensors& out) {
  const std::string h = "transformer.h." + std::to_string(i) + ".", b = "blocks." + std::to_string(i) + ".";
  for (const char* ln : {"ln_1", "ln_2"}) {
    add(out, h + ln + ".weight", in.get(b + ln + ".weight", Shape{d}), Shape{d});
    add(out, h + ln + ".bias", in.get(b + ln + ".bias", Shape{d}), Shape{d});
  }
  std::vector<float> qkv_w(static_cast<size_t>(3 * d * d)), qkv_b;
  const char* parts[] = {"q", "k", "v"};
  for (int p = 0; p < 3; ++p) {
    put_columns(qkv_w, d, 3 * d, p * d, transposed(in.get(b + "attn." + parts[p] + ".weight", Shape{d, d}), d, d), d);
    const std::vector<float> bias = in.get(b + "attn." + parts[p] + ".bias", Shape{d});
    qkv_b.insert(qkv_b.end(), bias.begin(), bias.end());
  }
  add(out, h + "attn.c_attn.weight", qkv_w, Shape{d, 3 * d});
  add(out, h + "attn.c_attn.bias", qkv_b, Shape{3 * d});
  struct Projection { const char* hf; const char* belay; int64_t in, out; };
  for (const Projection& p : {Projection{"attn.c_proj", "attn.proj", d, d}, Projection{"mlp.c_fc", "mlp.fc", d, 4 * d},
                              Projection{"mlp.c_proj", "mlp.proj", 4 * d, d}}) {
    add(out, h + p.hf + ".weight", transposed(in.get(b + p.belay + ".weight", Shape{p.out, p.in}), p.out, p.in),
        Shape{p.in, p.out});
    add(out, h + p.hf + ".bias", in.get(b + p.belay + ".bias", Shape{p.out}), Shape{p.out});
  }
}

// The settings of a GPT file, or UsageError naming what it holds instead.
std::map<std::string, std::string> gpt_settings(const SafetensorsFile& file) {
  const std::string& path = file.source();
  std::map<std::string, std::string> s = model_file_settings(file);
  const std::string model = s.count("model") ? s.at("model") : "";
  if (model != "gpt")
    throw UsageError("'" + path + "' holds a " + (model.empty() ? std::string("model of no recorded kind") : model) +
                     " model; the Hugging Face export is GPT-2's: give a file of belay train --model gpt");
  TrainConfig c;
  read_model_settings(s, path, c);
  return s;
}

void refuse_existing(const fs::path& dir) {
  for (const char* name : {"config.json", "model.safetensors"})
    if (fs::exists(dir / name))
      throw UsageError("'" + dir.string() + "' already holds " + name +
                       ": export into a new directory (nothing is overwritten)");
}

}  // namespace

std::string hf_gpt2_config_json(const std::map<std::string, std::string>& s) {
  json c = json::object();
  c["activation_function"] = s.count("gelu") && s.at("gelu") == "tanh" ? "gelu_new" : "gelu";
  c["architectures"] = json::array({"GPT2LMHeadModel"});
  // GPT2Config's defaults (50256, GPT-2's <|endoftext|>) would name a token outside another vocabulary.
  c["bos_token_id"] = nullptr;
  c["eos_token_id"] = nullptr;
  for (const char* drop : {"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout"}) c[drop] = 0.0;
  c["initializer_range"] = 0.02;
  c["layer_norm_epsilon"] = 1e-5;
  c["model_type"] = "gpt2";
  c["n_embd"] = setting(s, "width");
  c["n_head"] = setting(s, "heads");
  c["n_inner"] = nullptr;
  c["n_layer"] = setting(s, "layers");
  c["n_positions"] = setting(s, "context");
  c["vocab_size"] = setting(s, "out");
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["tie_word_embeddings"] = true;
  c["use_cache"] = true;
  return c.dump(2) + "\n";
}

std::vector<std::string> export_hf_gpt2(const std::string& model_path, const std::string& dir) {
  const fs::path target(dir);
  refuse_existing(target);
  const BelayTensors in(model_path);
  const std::map<std::string, std::string> s = gpt_settings(in.file());
  const int64_t d = setting(s, "width"), v = setting(s, "out"), c = setting(s, "context");
  NamedTensors out;
  add(out, "transformer.wte.weight", in.get("wte.weight", Shape{v, d}), Shape{v, d});
  add(out, "transformer.wpe.weight", in.get("wpe.weight", Shape{c, d}), Shape{c, d});
  for (int64_t i = 0; i < setting(s, "layers"); ++i) write_block(in, i, d, out);
  add(out, "transformer.ln_f.weight", in.get("ln_f.weight", Shape{d}), Shape{d});
  add(out, "transformer.ln_f.bias", in.get("ln_f.bias", Shape{d}), Shape{d});

  std::error_code made;
  fs::create_directories(target, made);
  if (made) throw UsageError("cannot make the directory '" + dir + "': " + made.message());
  const std::string weights = (target / "model.safetensors").string(), config = (target / "config.json").string();
  const std::shared_ptr<const BpeTokenizer> tokenizer = recorded_bpe_tokenizer(in.file().metadata(), model_path);
  write_safetensors(weights, out, {{"format", "pt"}});  // transformers reads only files that say "pt"
  try {
    write_file_atomically(config, hf_gpt2_config_json(s));
    if (tokenizer) tokenizer->write_files(dir);
  } catch (...) {
    fs::remove(weights);  // not half an export: the weights and the config, or neither
    fs::remove(config);
    throw;
  }
  std::vector<std::string> written{weights, config};
  if (tokenizer)
    for (const char* name : {"vocab.json", "merges.txt", "tokenizer.json"}) written.push_back((target / name).string());
  return written;
}

}  // namespace belay
