// The model-kind table (apps/run/model_kinds.h): one row per `--model`, and the few functions
// that read it for every front end.
#include "apps/run/model_kinds.h"

#include "amp/checkpoint.h"
#include "apps/run/train.h"
#include "autograd/gpt.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/random.h"
#include "engine/text_fields.h"

namespace belay {

namespace {

// The sizes, each read and written through the config (`layers` is an int there).
const ShapeField kIn{"in", [](const TrainConfig& c) { return c.in_features; },
                     [](TrainConfig& c, int64_t v) { c.in_features = v; }};
const ShapeField kOut{"out", [](const TrainConfig& c) { return c.out_features; },
                      [](TrainConfig& c, int64_t v) { c.out_features = v; }};
const ShapeField kHidden{"hidden", [](const TrainConfig& c) { return c.hidden; },
                         [](TrainConfig& c, int64_t v) { c.hidden = v; }};
const ShapeField kLayers{"layers", [](const TrainConfig& c) { return int64_t{c.layers}; },
                         [](TrainConfig& c, int64_t v) { c.layers = static_cast<int>(v); }};
const ShapeField kWidth{"width", [](const TrainConfig& c) { return c.width; },
                        [](TrainConfig& c, int64_t v) { c.width = v; }};
const ShapeField kHeads{"heads", [](const TrainConfig& c) { return c.heads; },
                        [](TrainConfig& c, int64_t v) { c.heads = v; }};
const ShapeField kContext{"context", [](const TrainConfig& c) { return c.context; },
                          [](TrainConfig& c, int64_t v) { c.context = v; }, "wpe.weight"};

// A GPT's shape: the vocabulary is out_features, the tokens file's.
GptConfig gpt_config_of(const TrainConfig& c) {
  GptConfig g;
  g.vocab = c.out_features;
  g.context = c.context;
  g.width = c.width;
  g.layers = c.layers;
  g.heads = c.heads;
  g.fused_attention = c.attention == "fused";
  g.gelu = c.gelu == "tanh" ? Activation::GeluTanh : Activation::Gelu;
  return g;
}

double linear_parameters(const TrainConfig& c) {
  const double in = static_cast<double>(c.in_features), out = static_cast<double>(c.out_features);
  return in * out + out;
}

double mlp_parameters(const TrainConfig& c) {
  const double in = static_cast<double>(c.in_features), out = static_cast<double>(c.out_features);
  const double h = static_cast<double>(c.hidden);
  return in * h + h + (c.layers - 2) * (h * h + h) + h * out + out;
}

void check_mlp(const TrainConfig& c) {
  if (c.hidden <= 0) throw UsageError("--hidden must be positive, got " + std::to_string(c.hidden));
  if (c.layers < 2) throw UsageError("--layers must be at least 2, got " + std::to_string(c.layers));
}

// A setting as a positive count; UsageError naming the file and the key otherwise.
int64_t positive_setting(const Settings& settings, const std::string& path, const char* key) {
  const auto it = settings.find(key);
  const std::string v = it == settings.end() ? "" : it->second;
  const int64_t n = parse_count(v).value_or(0);
  if (n < 1)
    throw UsageError("checkpoint '" + path + "' records no valid " + key + " ('" + v +
                     "'): write it again with a current belay train");
  return n;
}

void check_gpt(const TrainConfig& c) {
  gpt_config_of(c).validate();
  if (c.attention != "fused" && c.attention != "naive")
    throw UsageError("--attention must be fused or naive, got '" + c.attention + "'");
  if (c.gelu != "erf" && c.gelu != "tanh") throw UsageError("--gelu must be erf or tanh, got '" + c.gelu + "'");
}

// A GPT trains in minutes on 2 cores with these (AdamW lr 3e-3 with 100 warmup steps and a
// cosine decay, weight decay 0.1, clip 1, batch 32 sequences, 1500 steps, held-out loss
// every 250); its warmup is cut to a tenth of a shorter run (apply_kind_defaults).
std::vector<KindDefault> gpt_defaults() {
  return {
    {"lr", [](TrainConfig& c) { c.lr = 3e-3f; }},
    {"schedule", [](TrainConfig& c) { c.schedule = "cosine"; }},
    {"warmup", [](TrainConfig& c) { c.warmup = 100; }},
    {"weight-decay", [](TrainConfig& c) { c.weight_decay = 0.1f; }},
    {"clip", [](TrainConfig& c) { c.max_norm = 1.0f; }},
    {"batch", [](TrainConfig& c) { c.batch = 32; }},
    {"steps", [](TrainConfig& c) { c.steps = 1500; }},
    {"eval-every", [](TrainConfig& c) { c.eval_every = 250; }},
  };
}

// Built on first use (from any translation unit's static initialisation too: the option
// table's --model help reads it).
std::vector<ModelKind> make_model_kinds() {
  return {
    {"linear", nullptr, {kIn, kOut}, {}, false, false, {}, [](const TrainConfig&) {}, linear_parameters,
     [](const TrainConfig& c, Rng& rng, Device device) -> std::unique_ptr<Module> {
       return std::make_unique<Linear>(c.in_features, c.out_features, rng, true, device);
     }},
    {"mlp", nullptr, {kIn, kOut, kHidden, kLayers}, {}, false, true, {}, check_mlp, mlp_parameters,
     [](const TrainConfig& c, Rng& rng, Device device) -> std::unique_ptr<Module> {
       return std::make_unique<Mlp>(c.in_features, c.hidden, c.out_features, rng, c.layers, Activation::Gelu, device);
     }},
    // A GPT on a tokens file: "in" is its context, "out" the file's vocabulary.
    {"gpt", "gpt: a small transformer on a tokens file: --data", {kLayers, kWidth, kHeads, kContext},
     {"eval-every", "eval-windows", "attention", "gelu"}, true, false, gpt_defaults(), check_gpt,
     [](const TrainConfig& c) { return gpt_config_of(c).parameter_count(); },
     [](const TrainConfig& c, Rng& rng, Device device) -> std::unique_ptr<Module> {
       return std::make_unique<Gpt>(gpt_config_of(c), rng, device);
     }},
  };
}

}  // namespace

const std::vector<ModelKind>& model_kinds() {
  static const std::vector<ModelKind> kinds = make_model_kinds();
  return kinds;
}

std::string model_kind_names(bool (*keep)(const ModelKind&)) {
  std::vector<const char*> names;
  for (const ModelKind& k : model_kinds())
    if (!keep || keep(k)) names.push_back(k.name);
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
  return text;
}

const ModelKind* find_model_kind(const std::string& name) {
  for (const ModelKind& k : model_kinds())
    if (name == k.name) return &k;
  return nullptr;
}

const ModelKind& model_kind(const std::string& name) {
  if (const ModelKind* k = find_model_kind(name)) return *k;
  throw UsageError("unknown model '" + name + "': use " + model_kind_names());
}

bool takes_option(const ModelKind& kind, const std::string& option) {
  for (const ShapeField& f : kind.shape)
    if (option == f.name) return true;
  for (const char* o : kind.other_options)
    if (option == o) return true;
  return false;
}

const std::set<std::string>& model_options() {
  static const std::set<std::string> options = [] {
    std::set<std::string> all;
    for (const ModelKind& k : model_kinds()) {
      for (const ShapeField& f : k.shape) all.insert(f.name);
      all.insert(k.other_options.begin(), k.other_options.end());
    }
    return all;
  }();
  return options;
}

void check_given_options(const ModelKind& kind, const std::set<std::string>& given) {
  for (const std::string& option : given) {
    if (!model_options().count(option) || takes_option(kind, option)) continue;
    std::string own;
    for (const std::string& o : model_options())
      if (takes_option(kind, o)) own += (own.empty() ? "--" : ", --") + o;
    throw UsageError("--" + option + " is not an option of --model " + kind.name + " (its options: " +
                     (own.empty() ? std::string("none") : own) + ")");
  }
}

void apply_kind_defaults(TrainConfig& c, const std::set<std::string>& given) {
  const ModelKind& kind = model_kind(c.model);
  bool chose_warmup = false;
  for (const KindDefault& d : kind.defaults)
    if (!given.count(d.option)) {
      d.apply(c);
      chose_warmup = chose_warmup || std::string(d.option) == "warmup";
    }
  if (!chose_warmup) return;
  if (c.schedule != "cosine") c.warmup = 0;  // the user's schedule has none (a constant LR)
  else if (c.warmup >= c.steps) c.warmup = c.steps / 10;
}

namespace {

// The settings a --init file records, or none for a file of weights alone (names and shapes
// only, as --init always took).
Settings init_file_settings(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  const auto format = f.metadata().find("format");
  const bool recorded = format != f.metadata().end() &&
                        (format->second == kCheckpointFormat || format->second == kModelFileFormat);
  return recorded ? model_file_settings(f) : Settings{};
}

// An option the user gave that the init file also records must agree with it.
void agree_with_init(const std::string& option, const std::string& given, const std::string& recorded,
                     const std::string& path) {
  if (given != recorded)
    throw UsageError("--" + option + " " + given + " differs from the init file's " + recorded + " ('" + path +
                     "'): leave --" + option + " out to take the file's");
}

}  // namespace

void apply_init_settings(TrainConfig& c, const std::set<std::string>& given) {
  if (c.init.empty()) return;
  const Settings s = init_file_settings(c.init);
  const auto model = s.find("model");
  if (model == s.end()) return;
  if (given.count("model")) agree_with_init("model", c.model, model->second, c.init);
  c.model = model_kind(model->second).name;
  const ModelKind& kind = model_kind(c.model);
  for (const ShapeField& f : kind.shape) {
    const int64_t recorded = positive_setting(s, c.init, f.name);
    if (!given.count(f.name)) f.set(c, recorded);
    else if (!(f.shorter_takes_first_rows_of && f.get(c) > 0 && f.get(c) < recorded))
      agree_with_init(f.name, std::to_string(f.get(c)), std::to_string(recorded), c.init);
  }
  if (takes_option(kind, "gelu") && s.count("gelu")) {
    if (given.count("gelu")) agree_with_init("gelu", c.gelu, s.at("gelu"), c.init);
    c.gelu = s.at("gelu");
  }
}

std::set<std::string> first_rows_tensors(const TrainConfig& c) {
  std::set<std::string> names;
  for (const ShapeField& f : model_kind(c.model).shape)
    if (f.shorter_takes_first_rows_of) names.insert(f.shorter_takes_first_rows_of);
  return names;
}

void write_model_settings(const TrainConfig& c, Settings& settings) {
  settings["model"] = c.model;
  for (const ShapeField& f : {kIn, kOut}) settings[f.name] = std::to_string(f.get(c));
  for (const ShapeField& f : model_kind(c.model).shape) settings[f.name] = std::to_string(f.get(c));
  if (takes_option(model_kind(c.model), "attention")) settings["attention"] = c.attention;
  if (takes_option(model_kind(c.model), "gelu")) settings["gelu"] = c.gelu;
}

void read_model_settings(const Settings& settings, const std::string& path, TrainConfig& c) {
  const auto model = settings.find("model");
  if (model == settings.end())
    throw UsageError("checkpoint '" + path + "' records no model: write it again with belay train");
  c.model = model_kind(model->second).name;
  for (const ShapeField& f : {kIn, kOut}) f.set(c, positive_setting(settings, path, f.name));
  for (const ShapeField& f : model_kind(c.model).shape) f.set(c, positive_setting(settings, path, f.name));
  if (takes_option(model_kind(c.model), "attention")) {
    const auto it = settings.find("attention");
    c.attention = it == settings.end() ? "naive" : it->second;  // recorded since the fused op; before: naive
  }
  if (takes_option(model_kind(c.model), "gelu")) {
    const auto it = settings.find("gelu");
    c.gelu = it == settings.end() ? "erf" : it->second;  // recorded since the tanh form; before: erf
  }
}

std::unique_ptr<Module> model_from_settings(const Settings& settings, const std::string& path, Device device) {
  TrainConfig c;
  read_model_settings(settings, path, c);
  const ModelKind& kind = model_kind(c.model);
  kind.check(c);
  Rng rng(0);
  return kind.build(c, rng, device);
}

}  // namespace belay
