#include "apps/run/validate_gpt.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "apps/run/model_kinds.h"
#include "apps/run/sample.h"
#include "apps/run/token_dataset.h"
#include "apps/run/validate_report.h"
#include "autograd/graph.h"
#include "engine/atomic_file.h"
#include "engine/error.h"

namespace belay {

namespace {

using Json = nlohmann::json;

struct GptThresholds {
  double rtol, atol, tie_margin;
  int64_t max_flips;
};

constexpr int64_t kListed = 10;  // changed decisions listed one by one (all are counted)
constexpr int64_t kBatch = 8;    // held-out windows per forward

// The defaults follow validate's (validate.cpp, resolve()), from the dtype's unit roundoff u:
// atol u and a near-tie under a top-2 gap of 64u as there; rtol at validate's rate per
// low-precision product on a logit's longest path (its MLP default, 16u, is for a path of 2
// products: 8u each). A GPT's path has 6 products a block (q, q k^T, the attention times v,
// attn.proj, mlp.fc, mlp.proj) and the tied head: rtol = 8u (6 layers + 1), 104u for 2 blocks.
// (Measured on a 2-block GPT trained 300 steps: 32u fp16, 68u bf16; validate's 16u failed
// fp16 at 3 of 2048 positions: a two-layer rate cannot hold a 13-product path.)
GptThresholds resolve(const ValidateConfig& c, int64_t layers) {
  const double u = 0.5 * static_cast<double>(finfo(c.dtype).eps);
  const double path = 6.0 * static_cast<double>(layers) + 1.0;
  return {c.rtol.value_or(8.0 * u * path), c.atol.value_or(u), c.tie_margin.value_or(64.0 * u), c.max_flips};
}

void check_options(const ValidateConfig& c) {
  if (c.dtype == DType::F32)
    throw UsageError("validate compares fp16 or bf16 with the FP32 reference: give --dtype fp16|bf16");
  if (c.checkpoint.empty())
    throw UsageError("validate --model gpt checks a trained GPT: give --checkpoint CK (from belay train --model gpt)");
  if (c.data.empty())
    throw UsageError("validating a GPT needs held-out text: give --data TOKENS.safetensors (the tokens file it "
                     "trained on; apps/data/make_text_corpus.py makes one)");
  if (!c.init.empty()) throw UsageError("--init and --checkpoint both give the model: pick one");
  if (!c.save_set.empty()) throw UsageError("--save-set writes a generated set; a GPT is validated on --data text");
  if (c.train_steps != 0) throw UsageError("--train trains a linear or MLP model; train a GPT with belay train");
  if (c.windows < 1) throw UsageError("--windows must be at least 1, got " + std::to_string(c.windows));
  if (c.max_flips < 0) throw UsageError("--max-flips must be >= 0");
  check_threshold("--rtol", c.rtol);
  check_threshold("--atol", c.atol);
  check_threshold("--tie-margin", c.tie_margin);
  if (c.rtol == 0.0 && c.atol == 0.0) throw UsageError("--rtol and --atol are both 0: no rounding would pass");
  if (!c.json.empty()) check_writable(c.json);
}

// The logits of ids [B, T] ([B T, V]), without a gradient: in FP32, or under autocast.
std::vector<float> logits_of(Gpt& model, const Tensor& ids, DType dtype, uint32_t fp32_ops) {
  NoGrad no_grad;
  Autocast autocast(dtype, dtype != DType::F32, fp32_ops);
  return model.forward(Var(ids)).value().to_vector();
}

// A token as the report shows it: its id, and its byte when printable.
std::string token_str(int64_t id) {
  std::string s = std::to_string(id);
  if (id >= 32 && id < 127) s += id == '\'' ? " (\"'\")" : " ('" + std::string(1, static_cast<char>(id)) + "')";
  return s;
}

// Everything counted over the decisions (one per held-out position).
struct Tally {
  int64_t tokens = 0, changed = 0, near_ties = 0, near_tie_changed = 0;
  int64_t ref_nonfinite = 0, amp_nonfinite = 0, out_of_tolerance = 0;
  double ref_loss = 0, amp_loss = 0;  // sums of -log p(next token), nats
  double max_abs = 0, max_rel = 0;    // logit errors where both are finite
  Json changed_rows = Json::array();
  std::ostringstream listed;
};

// Top-1 index (ties to the lowest) and top-1 minus top-2; index -1 for a non-finite row.
std::pair<int64_t, double> top_of(const float* s, int64_t n) {
  int64_t best = 0;
  double top = -INFINITY, second = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(s[j])) return {-1, NAN};
    if (s[j] > top) second = top, top = s[j], best = j;
    else if (s[j] > second) second = s[j];
  }
  return {best, top - second};
}

// -log softmax(s)[label] in double.
double nll(const float* s, int64_t n, int64_t label) {
  double mx = -INFINITY, z = 0;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(s[j]));
  for (int64_t j = 0; j < n; ++j) z += std::exp(static_cast<double>(s[j]) - mx);
  return mx + std::log(z) - s[label];
}

void tally_position(const float* ref, const float* amp, int64_t v, int64_t label, int64_t position,
                    const GptThresholds& t, Tally& s) {
  ++s.tokens;
  const auto [dr, margin] = top_of(ref, v);
  const int64_t da = top_of(amp, v).first;
  if (dr < 0) ++s.ref_nonfinite;
  else s.ref_loss += nll(ref, v, label);
  if (da < 0) ++s.amp_nonfinite;
  else s.amp_loss += nll(amp, v, label);
  if (dr < 0) return;  // no decision to compare with: the baseline's own failure
  if (da >= 0) {
    double scale = 0, worst = 0;
    for (int64_t j = 0; j < v; ++j) scale = std::max(scale, std::fabs(static_cast<double>(ref[j])));
    for (int64_t j = 0; j < v; ++j) worst = std::max(worst, std::fabs(static_cast<double>(amp[j]) - ref[j]));
    s.max_abs = std::max(s.max_abs, worst);
    if (scale > 0) s.max_rel = std::max(s.max_rel, worst / scale);
    s.out_of_tolerance += !(worst <= t.atol + t.rtol * scale);
  }
  const bool near = margin < t.tie_margin;
  s.near_ties += near;
  if (dr == da) return;
  ++s.changed;
  s.near_tie_changed += near;
  if (s.changed > kListed) return;
  s.listed << "  position " << std::setw(6) << position << ": ref -> " << token_str(dr) << ", amp -> "
           << (da < 0 ? std::string("none (non-finite)") : token_str(da)) << ", ref margin " << std::setprecision(4)
           << margin << (near ? " (near-tie)" : "") << "\n";
  s.changed_rows.push_back(
      {{"position", position}, {"ref_token", dr}, {"amp_token", da}, {"ref_margin", margin}, {"near_tie", near}});
}

// Both forwards over the held-out windows, every position tallied.
Tally run_windows(Gpt& model, const TokenDataset& data, const ValidateConfig& c, const GptThresholds& t) {
  Tally s;
  const int64_t v = model.config().vocab;
  HeldOutBatches batches(data, kBatch, c.windows);
  while (std::optional<Batch> b = batches.next(Device::cpu())) {
    const std::vector<float> ref = logits_of(model, b->x, DType::F32, 0);
    const std::vector<float> amp = logits_of(model, b->x, c.dtype, c.fp32_ops);
    const std::vector<float> next = b->y.to_vector();
    for (size_t p = 0; p < next.size(); ++p)
      tally_position(&ref[p * v], &amp[p * v], v, static_cast<int64_t>(next[p]), s.tokens, t, s);
  }
  return s;
}

std::string tokens_count(const TokenDataset& d, int64_t windows) {
  return std::to_string(windows) + " windows of " + std::to_string(d.context()) + " tokens";
}

}  // namespace

namespace {

// The report's comparison: printed, and as JSON with its checks and `pass`.
Json compare(const Tally& s, const GptThresholds& t, const char* amp_label, std::ostream& out) {
  const double n = static_cast<double>(s.tokens);
  Json j;
  out << "\nlogits (" << amp_label << " vs fp32; rel = |error| / max|ref| of the position): max abs err "
      << std::setprecision(4) << s.max_abs << ", max rel err " << s.max_rel << "; " << s.out_of_tolerance
      << " positions outside the tolerance\n";
  j["logits"] = {{"max_abs_error", s.max_abs}, {"max_rel_error", s.max_rel}, {"out_of_tolerance", s.out_of_tolerance}};
  out << "decisions (next-token argmax, ties to the lowest id): " << s.changed << " changed of " << s.tokens << " ("
      << std::setprecision(3) << 100.0 * static_cast<double>(s.changed) / n << "%); " << s.near_ties
      << " near-ties (reference top-2 gap < " << std::setprecision(4) << t.tie_margin << "), " << s.near_tie_changed
      << " of them changed\n"
      << s.listed.str();
  if (s.changed > kListed) out << "  ... and " << s.changed - kListed << " more\n";
  j["decisions"] = {{"tokens", s.tokens},
                    {"changed", s.changed},
                    {"changed_fraction", static_cast<double>(s.changed) / n},
                    {"near_ties", s.near_ties},
                    {"near_tie_changed", s.near_tie_changed},
                    {"changed_rows", s.changed_rows}};
  // A run's loss only when every one of its positions is finite (else none: NaN, null in JSON).
  const double ref_loss = s.ref_nonfinite == 0 ? s.ref_loss / n : NAN;
  const double amp_loss = s.amp_nonfinite == 0 ? s.amp_loss / n : NAN;
  out << "loss (nats per token): " << std::setprecision(6) << ref_loss << " (fp32) vs " << amp_loss << " ("
      << amp_label << "), difference " << std::setprecision(3) << amp_loss - ref_loss << "\n";
  j["loss"] = {{"unit", "nats_per_token"},
               {"fp32", std::isfinite(ref_loss) ? Json(ref_loss) : Json(nullptr)},
               {"amp", std::isfinite(amp_loss) ? Json(amp_loss) : Json(nullptr)},
               {"difference", std::isfinite(amp_loss - ref_loss) ? Json(amp_loss - ref_loss) : Json(nullptr)}};
  const int64_t clear_flips = s.changed - s.near_tie_changed;
  const std::vector<ValidateCheck> checks{
      {"baseline: FP32 reference finite", s.ref_nonfinite == 0,
       std::to_string(s.ref_nonfinite) + " positions with non-finite reference logits"},
      {"amp: no non-finite value", s.amp_nonfinite == 0,
       std::to_string(s.amp_nonfinite) + " positions with non-finite AMP logits"},
      {"logits within tolerance", s.out_of_tolerance == 0, std::to_string(s.out_of_tolerance) + " positions outside"},
      {"changed decisions away from near-ties <= max-flips", clear_flips <= t.max_flips,
       std::to_string(clear_flips) + " changed, at most " + std::to_string(t.max_flips) + " allowed"},
  };
  bool pass = true;
  const Json cj = print_checks(checks, pass, out);
  j["checks"] = cj;
  j["pass"] = pass;
  return j;
}

// The model kind a checkpoint or model file records ("" when none).
std::string recorded_model(const std::string& path) {
  const std::map<std::string, std::string> s = model_file_settings(path);
  const auto it = s.find("model");
  return it == s.end() ? "" : it->second;
}

}  // namespace

bool validates_gpt(const ValidateConfig& c) {
  // With --init too, validate's own check says to pick one (before the file is even read).
  // A kind of token data (a GPT), named by --model or by the checkpoint.
  auto of_tokens = [](const std::string& name) {
    const ModelKind* kind = find_model_kind(name);
    return kind && kind->token_data;
  };
  return of_tokens(c.model) || (!c.checkpoint.empty() && c.init.empty() && of_tokens(recorded_model(c.checkpoint)));
}

ValidateResult run_validate_gpt(const ValidateConfig& c, std::ostream& out) {
  check_options(c);
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(c.checkpoint);
  const GptConfig& g = model->config();
  const std::unique_ptr<TokenDataset> data = load_token_dataset(c.data, g.context, 0);
  if (data->vocab() != g.vocab)
    throw UsageError("tokens file '" + c.data + "' has a vocabulary of " + std::to_string(data->vocab()) +
                     " tokens, the checkpoint's GPT " + std::to_string(g.vocab) + ": give the file it trained on");
  const int64_t windows = std::min(c.windows, data->heldout_windows());
  const GptThresholds t = resolve(c, g.layers);
  Json report;
  report["model"] = {{"kind", "gpt"},          {"from", "checkpoint '" + c.checkpoint + "'"},
                     {"vocab", g.vocab},       {"context", g.context},
                     {"width", g.width},       {"layers", g.layers},
                     {"heads", g.heads},       {"parameters", model->parameter_count()}};
  report["set"] = {{"source", "'" + c.data + "' held-out split"}, {"windows", windows}, {"context", g.context},
                   {"task", "next-token"}};
  report["dtype"] = dtype_name(c.dtype);
  report["fp32_ops"] = c.fp32_ops ? fp32_ops_names(c.fp32_ops) : "none";
  report["thresholds"] = {{"rtol", t.rtol},           {"atol", t.atol}, {"max_flips", t.max_flips},
                          {"tie_margin", t.tie_margin}, {"nonfinite_allowed", 0}};
  out << "belay validate: gpt " << model->parameter_count() << " parameters (checkpoint '" << c.checkpoint << "'), "
      << dtype_name(c.dtype) << " autocast vs fp32";
  if (c.fp32_ops) out << ", fp32 ops " << fp32_ops_names(c.fp32_ops);
  out << "\nset: the held-out text of '" << c.data << "', " << tokens_count(*data, windows) << " ("
      << windows * g.context << " next-token decisions)\n"
      << "thresholds (fixed before the runs): |amp - ref| <= atol " << t.atol << " + rtol " << t.rtol
      << " * max|ref| of the position's logits; no non-finite value; changed decisions away from near-ties <= "
      << t.max_flips << "; near-tie: a reference top-2 gap under " << t.tie_margin << "\n";
  out.flush();
  ValidateConfig bounded = c;
  bounded.windows = windows;
  const Tally s = run_windows(*model, *data, bounded, t);
  report["comparison"] = compare(s, t, dtype_name(c.dtype), out);
  const bool pass = report["comparison"]["pass"];
  return conclude_validate(pass, c, std::move(report), "text", out);
}

}  // namespace belay
