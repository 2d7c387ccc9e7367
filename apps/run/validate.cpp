#include "apps/run/validate.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "apps/run/accum_check.h"
#include "apps/run/dataset.h"
#include "apps/run/model_kinds.h"
#include "apps/run/train.h"
#include "apps/run/trainer.h"
#include "apps/run/validate_gpt.h"
#include "apps/run/validate_report.h"
#include "autograd/modules.h"
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"

namespace belay {

namespace {

using Json = nlohmann::json;

enum RowKind : int64_t { kOrdinary = 0, kLarge = 1, kNearZero = 2, kNearTie = 3 };
const char* kind_name(int64_t k) {
  switch (k) {
    case kOrdinary:
      return "ordinary";
    case kLarge:
      return "large";
    case kNearZero:
      return "near_zero";
    case kNearTie:
      return "near_tie";
    default:
      return "other";
  }
}
// Large rows: ordinary rows times 2^8, near-zero rows times 2^-16 (under FP16's smallest
// normal, 2^-14: the inputs become subnormals). Powers of two, so the scaling itself is exact.
constexpr float kLargeFactor = 0x1p8f;
constexpr float kNearZeroFactor = 0x1p-16f;

struct EvalSet {
  Tensor x;              // FP32 [N, in]
  std::vector<float> y;  // labels (classification) or targets [N * out]
  bool classification = true;
  int64_t outputs = 0;  // classes, or regression outputs
  std::vector<int64_t> kind;  // empty: a set from --data without a `kind` tensor
  std::string source;
  int64_t rows() const { return x.dim(0); }
};

// The kind column of a row's line ("large     "), or nothing when the set names no kinds.
std::string kind_cell(const EvalSet& set, int64_t r) {
  if (set.kind.empty()) return "";
  std::string k = kind_name(set.kind[static_cast<size_t>(r)]);
  return " " + k + std::string(k.size() < 10 ? 10 - k.size() : 0, ' ');
}

struct Thresholds {
  double rtol, atol, tie_margin, min_quality;
  int64_t max_flips;
};

// The defaults, from the dtype's unit roundoff u (2^-11 fp16, 2^-8 bf16) rather than from
// any run: a score is a few FP32-accumulated sums of products whose inputs were rounded to
// the dtype (2u each) and whose outputs are rounded once per layer (u), through two layers,
// so its error is a small multiple of u times the row's score scale; 16u leaves room for the
// amplification of the first layer's rounding by the second. Two scores within it may close
// a gap of 2 * 16u * scale; the tie margin is twice that for scores of order 1 (64u), and the
// generated near-ties lie in [32u, 64u): as close as the tolerance lets a decision be kept.
Thresholds resolve(const ValidateConfig& c) {
  const double u = 0.5 * static_cast<double>(finfo(c.dtype).eps);
  Thresholds t{c.rtol.value_or(16.0 * u), c.atol.value_or(u), c.tie_margin.value_or(64.0 * u), c.min_quality,
               c.max_flips};
  return t;
}

TrainConfig model_config(const ValidateConfig& c) {
  TrainConfig m;
  m.model = c.model;
  m.in_features = c.in_features;
  m.out_features = c.out_features;
  m.hidden = c.hidden;
  m.layers = c.layers;
  m.seed = c.seed;
  if (!c.checkpoint.empty()) read_model_settings(model_file_settings(c.checkpoint), c.checkpoint, m);
  return m;
}

std::unique_ptr<Module> build_model(const ValidateConfig& c, const TrainConfig& m) {
  Rng rng(m.seed);
  std::unique_ptr<Module> model = make_model(m, rng, Device::cpu());
  // A checkpoint holds the masters under the state-dict names, as an --init file does.
  if (!c.checkpoint.empty())
    load_initial_weights(c.checkpoint, *model);
  else if (!c.init.empty())
    load_initial_weights(c.init, *model);
  return model;
}

// The forward as the application runs it: no gradient; in FP32, or under autocast.
std::vector<float> scores_of(Module& model, const Tensor& x, DType dtype, uint32_t fp32_ops) {
  NoGrad no_grad;
  Autocast autocast(dtype, dtype != DType::F32, fp32_ops);
  return model(Var(x)).value().to_vector();
}

// argmax with ties to the lowest index; -1 when the row is not all finite.
int64_t decide(const float* s, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(s[j])) return -1;
    if (s[j] > s[best]) best = j;
  }
  return best;
}
// Top-1 minus top-2 (0 for a tie; inf with one output).
double margin_of(const float* s, int64_t n) {
  double top = -INFINITY, second = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (s[j] > top) {
      second = top;
      top = s[j];
    } else if (s[j] > second) {
      second = s[j];
    }
  }
  return top - second;
}

// The rows of a generated set: drawn from N(0, 1), labelled by a seeded linear teacher
// (argmax of T x, no bias, so a row's label does not change with its scale), placed by the
// model's FP32 reference scores.
class RowMaker {
 public:
  RowMaker(const ValidateConfig& c, const TrainConfig& m, Module& model, uint64_t stream)
      : in_(m.in_features), classes_(m.out_features), model_(model), data_rng_(c.seed * 2 + 1002 + 7919 * stream) {
    Rng teacher_rng(c.seed * 2 + 1001);
    teacher_.resize(static_cast<size_t>(classes_ * in_));
    for (float& w : teacher_) w = teacher_rng.normal() / std::sqrt(static_cast<float>(in_));
  }

  int64_t label_of(const float* x) const {
    int64_t best = 0;
    double best_v = -INFINITY;
    for (int64_t k = 0; k < classes_; ++k) {
      double v = 0;
      for (int64_t i = 0; i < in_; ++i) v += static_cast<double>(teacher_[k * in_ + i]) * x[i];
      if (v > best_v) best_v = v, best = k;
    }
    return best;
  }

  // Ordinary, large and near-zero rows are kept away from the decision boundary (reference
  // margin >= tie_margin; up to 100 draws a row, then the last draw is kept) so that the
  // near-ties of the set are the rows built as such, at a margin the set states.
  std::vector<float> away_from_ties(float factor, double tie_margin) {
    std::vector<float> v;
    for (int attempt = 0; attempt < 100; ++attempt) {
      v = normal_row();
      for (float& e : v) e *= factor;
      const std::vector<float> s = reference(v);
      if (margin_of(s.data(), classes_) >= tie_margin) break;
    }
    return v;
  }

  // A near-tie at a reference margin in [tie_margin / 2, tie_margin): between two rows whose
  // reference decisions differ, bisection along the segment towards the point where the
  // reference decision changes. Empty when this pair gives none.
  std::vector<float> near_tie(double tie_margin) {
    const std::vector<float> a = normal_row(), b = normal_row();
    const std::vector<float> sa = reference(a), sb = reference(b);
    const int64_t da = decide(sa.data(), classes_), db = decide(sb.data(), classes_);
    if (da < 0 || db < 0 || da == db) return {};
    // Invariant: decision(lo) == da, decision(hi) != da.
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      std::vector<float> x(static_cast<size_t>(in_));
      for (int64_t i = 0; i < in_; ++i) x[i] = static_cast<float>((1.0 - mid) * a[i] + mid * b[i]);
      const std::vector<float> s = reference(x);
      if (decide(s.data(), classes_) != da) {
        hi = mid;
        continue;
      }
      lo = mid;
      const double mg = margin_of(s.data(), classes_);
      if (mg < tie_margin) return mg >= 0.5 * tie_margin ? x : std::vector<float>{};  // else overshot: another pair
    }
    return {};
  }

 private:
  std::vector<float> normal_row() {
    std::vector<float> r(static_cast<size_t>(in_));
    for (float& v : r) v = data_rng_.normal();
    return r;
  }
  std::vector<float> reference(const std::vector<float>& r) {
    return scores_of(model_, Tensor::from_vector(r, Shape{1, in_}), DType::F32, 0);
  }

  int64_t in_, classes_;
  Module& model_;
  Rng data_rng_;
  std::vector<float> teacher_;
};

// Generated: `rows` ordinary rows and rows/4 each of large, near-zero and near-tie rows
// (RowMaker). `stream` picks other rows from the same teacher (the training set of --train).
EvalSet generate_set(const ValidateConfig& c, const TrainConfig& m, Module& model, double tie_margin,
                     uint64_t stream = 0) {
  const int64_t in = m.in_features, classes = m.out_features;
  if (classes < 2) throw UsageError("a generated set needs at least 2 classes (--out), got " + std::to_string(classes));
  if (c.rows < 4) throw UsageError("--rows must be at least 4, got " + std::to_string(c.rows));
  RowMaker maker(c, m, model, stream);
  EvalSet set;
  set.outputs = classes;
  set.source = "generated (seed " + std::to_string(c.seed) + ")";
  std::vector<float> xs;
  auto add = [&](const std::vector<float>& r, int64_t kind) {
    xs.insert(xs.end(), r.begin(), r.end());
    set.y.push_back(static_cast<float>(maker.label_of(r.data())));
    set.kind.push_back(kind);
  };
  const int64_t extra = std::max<int64_t>(1, c.rows / 4);
  for (int64_t r = 0; r < c.rows; ++r) add(maker.away_from_ties(1.0f, tie_margin), kOrdinary);
  for (int64_t r = 0; r < extra; ++r) add(maker.away_from_ties(kLargeFactor, tie_margin), kLarge);
  for (int64_t r = 0; r < extra; ++r) add(maker.away_from_ties(kNearZeroFactor, tie_margin), kNearZero);
  // Near-ties at a reference margin in [tie_margin / 2, tie_margin): flagged as near-ties, and
  // just wider than the error the score tolerance allows a difference of two scores.
  int64_t built = 0;
  for (int attempt = 0; built < extra && attempt < 100 * extra; ++attempt) {
    const std::vector<float> x = maker.near_tie(tie_margin);
    if (x.empty()) continue;
    add(x, kNearTie);
    ++built;
  }
  if (built < extra)
    throw Error("could not build " + std::to_string(extra) + " near-tie rows for this model (built " +
                std::to_string(built) + "); give a --data set");
  set.x = Tensor::from_vector(xs, Shape{static_cast<int64_t>(set.kind.size()), in});
  return set;
}

void save_set(const EvalSet& set, const std::string& path, double tie_margin) {
  std::vector<int64_t> labels;
  for (float v : set.y) labels.push_back(static_cast<int64_t>(v));
  std::map<std::string, std::string> meta{{"belay.set", set.source},
                                          {"belay.set.kinds", "0=ordinary,1=large,2=near_zero,3=near_tie"},
                                          {"belay.set.near_tie_margin", exact_float(static_cast<float>(tie_margin))}};
  write_safetensors(path, {{"x", set.x}}, meta, {{"y", labels}, {"kind", set.kind}});
}

// --data: x [N, in] and y (I64 labels [N], or floats [N, out]); an optional I64 `kind` [N].
// Non-finite values are kept: they are what validate is for (in the reference, a baseline failure).
EvalSet load_set(const std::string& path, int64_t model_in, int64_t model_out) {
  const SafetensorsFile f = read_safetensors(path);
  for (const char* name : {"x", "y"})
    if (!f.contains(name))
      throw UsageError("set '" + path + "' has no tensor '" + name + "' (it needs x [N, in] and y)");
  const SafetensorsEntry& ex = f.entry("x");
  if (ex.shape.size() != 2 || ex.shape[0] < 1 || ex.shape[1] != model_in)
    throw UsageError("set '" + path + "': x must be [N, " + std::to_string(model_in) + "] for this model, got " +
                     Shape(ex.shape).str());
  if (ex.dtype != "F32" && ex.dtype != "F16" && ex.dtype != "BF16")
    throw UsageError("set '" + path + "': x has dtype " + ex.dtype + "; use F32, F16 or BF16");
  EvalSet set;
  set.x = f.tensor("x").to(DType::F32);
  set.source = "'" + path + "'";
  const int64_t n = ex.shape[0];
  const SafetensorsEntry& ey = f.entry("y");
  if (ey.dtype == "I64") {
    if (ey.shape != std::vector<int64_t>{n})
      throw UsageError("set '" + path + "': labels y must be [" + std::to_string(n) + "]");
    for (int64_t l : f.int64s("y")) {
      if (l < 0 || l >= model_out)
        throw UsageError("set '" + path + "': label " + std::to_string(l) + " is not a class of this model (0.." +
                         std::to_string(model_out - 1) + ")");
      set.y.push_back(static_cast<float>(l));
    }
    set.classification = true;
  } else {
    if (ey.shape != std::vector<int64_t>{n, model_out})
      throw UsageError("set '" + path + "': targets y must be [" + std::to_string(n) + ", " +
                       std::to_string(model_out) + "] or I64 labels [" + std::to_string(n) + "]");
    set.y = f.tensor("y").to_vector();
    set.classification = false;
  }
  set.outputs = model_out;
  if (f.contains("kind")) {
    const std::vector<int64_t> k = f.int64s("kind");
    if (static_cast<int64_t>(k.size()) != n)
      throw UsageError("set '" + path + "': kind must be [" + std::to_string(n) + "]");
    set.kind = k;
  }
  return set;
}

std::string vec_str(const float* v, int64_t n) {
  std::ostringstream o;
  o << "[";
  for (int64_t j = 0; j < n; ++j) o << (j ? " " : "") << std::setprecision(6) << v[j];
  return o.str() + "]";
}

Json vec_json(const float* v, int64_t n) {
  Json a = Json::array();
  for (int64_t j = 0; j < n; ++j) {
    if (std::isfinite(v[j]))
      a.push_back(v[j]);
    else
      a.push_back(std::isnan(v[j]) ? "nan" : (v[j] > 0 ? "inf" : "-inf"));
  }
  return a;
}

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf")); }

struct Quality {
  double loss = 0, value = 0;  // value: accuracy (labels) or R^2 (targets)
};

Quality quality_of(const EvalSet& set, const std::vector<float>& s) {
  const int64_t n = set.rows(), k = set.outputs;
  Quality q;
  if (set.classification) {
    int64_t correct = 0;
    for (int64_t r = 0; r < n; ++r) {
      const float* row = &s[r * k];
      const int64_t label = static_cast<int64_t>(set.y[r]);
      double mx = -INFINITY;
      for (int64_t j = 0; j < k; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double z = 0;
      for (int64_t j = 0; j < k; ++j) z += std::exp(static_cast<double>(row[j]) - mx);
      q.loss += (mx + std::log(z) - row[label]) / static_cast<double>(n);  // NaN propagates
      if (decide(row, k) == label) ++correct;
    }
    q.value = static_cast<double>(correct) / static_cast<double>(n);
  } else {
    double mean = 0, sse = 0, sst = 0;
    for (float v : set.y) mean += v / static_cast<double>(set.y.size());
    for (size_t i = 0; i < s.size(); ++i) {
      sse += (static_cast<double>(s[i]) - set.y[i]) * (static_cast<double>(s[i]) - set.y[i]);
      sst += (set.y[i] - mean) * (set.y[i] - mean);
    }
    q.loss = sse / static_cast<double>(s.size());
    q.value = sst > 0 ? 1.0 - sse / sst : (sse == 0 ? 1.0 : -INFINITY);
  }
  return q;
}

// How many rows hold a non-finite AMP score; those whose reference is not finite either are
// listed with the baseline's failures, so the count says where each one is.
std::string amp_nonfinite_detail(int64_t all, size_t amp_only) {
  std::string d = std::to_string(all) + " rows with non-finite AMP scores";
  if (all > static_cast<int64_t>(amp_only))
    d += ", " + std::to_string(all - static_cast<int64_t>(amp_only)) +
         " of them with a non-finite reference too (listed as baseline failures)";
  return d;
}

// The two runs' scores on the set, row-major [rows, outputs], as compare() reads them.
struct Scores {
  const EvalSet& set;
  const std::vector<float>& ref;
  const std::vector<float>& amp;
  int64_t k;  // outputs per row
  const float* ref_row(int64_t r) const { return &ref[r * k]; }
  const float* amp_row(int64_t r) const { return &amp[r * k]; }
};

// Per output: errors (where both are finite), non-finite counts, extremes; and the rows
// that fail, each in the first list it belongs to.
struct ScoreErrors {
  std::vector<double> max_abs, max_rel, ref_ext, amp_ext;
  std::vector<int64_t> ref_bad, amp_bad;
  std::vector<int64_t> baseline_rows, nonfinite_rows, tol_rows;
  int64_t amp_nonfinite_rows = 0;  // every row with a non-finite AMP score, the reference's failures too
};

ScoreErrors score_errors(const Scores& sc, const Thresholds& t) {
  const int64_t n = sc.set.rows(), k = sc.k;
  const size_t ku = static_cast<size_t>(k);
  ScoreErrors e{std::vector<double>(ku, 0.0), std::vector<double>(ku, 0.0), std::vector<double>(ku, 0.0),
                std::vector<double>(ku, 0.0), std::vector<int64_t>(ku, 0), std::vector<int64_t>(ku, 0), {}, {}, {}, 0};
  for (int64_t r = 0; r < n; ++r) {
    double scale = 0;
    for (int64_t c = 0; c < k; ++c)
      if (std::isfinite(sc.ref[r * k + c])) scale = std::max(scale, std::fabs(static_cast<double>(sc.ref[r * k + c])));
    bool ref_ok = true, amp_ok = true, in_tol = true;
    for (int64_t c = 0; c < k; ++c) {
      const float a = sc.ref[r * k + c], b = sc.amp[r * k + c];
      if (!std::isfinite(a)) ++e.ref_bad[c], ref_ok = false;
      if (!std::isfinite(b)) ++e.amp_bad[c], amp_ok = false;
      if (std::isfinite(a)) e.ref_ext[c] = std::max(e.ref_ext[c], std::fabs(static_cast<double>(a)));
      if (std::isfinite(b)) e.amp_ext[c] = std::max(e.amp_ext[c], std::fabs(static_cast<double>(b)));
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const double err = std::fabs(static_cast<double>(b) - a);
      e.max_abs[c] = std::max(e.max_abs[c], err);
      if (scale > 0) e.max_rel[c] = std::max(e.max_rel[c], err / scale);
      if (!(err <= t.atol + t.rtol * scale)) in_tol = false;
    }
    e.amp_nonfinite_rows += !amp_ok;
    if (!ref_ok)
      e.baseline_rows.push_back(r);
    else if (!amp_ok)
      e.nonfinite_rows.push_back(r);
    else if (!in_tol)
      e.tol_rows.push_back(r);
  }
  return e;
}

// The per-output table, printed and as the report's "outputs".
Json outputs_table(const ScoreErrors& e, int64_t k, const char* ref_label, const char* amp_label, std::ostream& out) {
  out << "\nscores per output (" << amp_label << " vs " << ref_label << "; rel = |error| / max|ref| of the row):\n";
  out << "  output   max abs err   max rel err   non-finite ref/amp   max |ref|     max |amp|\n";
  Json outputs = Json::array();
  for (int64_t c = 0; c < k; ++c) {
    out << "  " << std::left << std::setw(9) << c << std::setw(14) << std::setprecision(4) << e.max_abs[c]
        << std::setw(14) << e.max_rel[c] << std::setw(21)
        << (std::to_string(e.ref_bad[c]) + " / " + std::to_string(e.amp_bad[c])) << std::setw(14) << e.ref_ext[c]
        << e.amp_ext[c] << std::right << "\n";
    outputs.push_back({{"output", c},
                       {"max_abs_error", e.max_abs[c]},
                       {"max_rel_error", e.max_rel[c]},
                       {"nonfinite_ref", e.ref_bad[c]},
                       {"nonfinite_amp", e.amp_bad[c]},
                       {"max_abs_ref", e.ref_ext[c]},
                       {"max_abs_amp", e.amp_ext[c]}});
  }
  return outputs;
}

Json row_json(const Scores& sc, int64_t r) {
  Json row{{"row", r}, {"ref", vec_json(sc.ref_row(r), sc.k)}, {"amp", vec_json(sc.amp_row(r), sc.k)}};
  if (!sc.set.kind.empty()) row["kind"] = kind_name(sc.set.kind[r]);
  return row;
}

// A list of failing rows under its title (nothing when empty), printed and as JSON.
Json list_rows(const Scores& sc, const char* title, const std::vector<int64_t>& rows, std::ostream& out) {
  Json a = Json::array();
  if (rows.empty()) return a;
  const int amp_indent = sc.set.kind.empty() ? 15 : 26;  // "amp [" under "ref ["
  out << "\n" << title << " (" << rows.size() << "):\n";
  for (int64_t r : rows) {
    out << "  row " << std::setw(4) << r << kind_cell(sc.set, r) << " ref " << vec_str(sc.ref_row(r), sc.k) << "\n"
        << std::setw(amp_indent) << "amp " << vec_str(sc.amp_row(r), sc.k) << "\n";
    a.push_back(row_json(sc, r));
  }
  return a;
}

// Changed decisions (classification only: a regression's outputs are judged by their
// errors and extremes alone), printed and as the report's "decisions". Returns the count.
int64_t compare_decisions(const Scores& sc, const Thresholds& t, Json& j, std::ostream& out) {
  const int64_t n = sc.set.rows(), k = sc.k;
  int64_t flips = 0, near_ties = 0, near_tie_flips = 0;
  Json changed = Json::array();
  std::ostringstream flips_text;
  if (sc.set.classification) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t dr = decide(sc.ref_row(r), k), da = decide(sc.amp_row(r), k);
      if (dr < 0) continue;  // the baseline's own failure, listed above
      const double mg = margin_of(sc.ref_row(r), k);
      const bool near = mg < t.tie_margin;
      near_ties += near;
      if (dr == da) continue;
      ++flips;
      near_tie_flips += near;
      flips_text << "  row " << std::setw(4) << r << kind_cell(sc.set, r) << " ref -> " << dr << ", amp -> "
                 << (da < 0 ? std::string("none (non-finite)") : std::to_string(da)) << ", ref margin "
                 << std::setprecision(4) << mg << (near ? " (near-tie)" : "") << "\n"
                 << "       ref " << vec_str(sc.ref_row(r), k) << "\n       amp " << vec_str(sc.amp_row(r), k) << "\n";
      Json row = row_json(sc, r);
      row["ref_decision"] = dr;
      row["amp_decision"] = da;
      row["ref_margin"] = mg;
      row["near_tie"] = near;
      changed.push_back(row);
    }
    out << "\ndecisions (argmax, ties to the lowest index): " << flips << " changed of " << n << "; " << near_ties
        << " near-ties (reference margin < " << t.tie_margin << "), " << near_tie_flips << " of them changed\n"
        << flips_text.str();
  }
  j["decisions"] = {
      {"changed", flips}, {"near_ties", near_ties}, {"near_tie_changed", near_tie_flips}, {"changed_rows", changed}};
  return flips;
}

// The verdict, threshold by threshold, printed and as the report's "checks" and "pass".
void verdict(const ScoreErrors& e, int64_t flips, const Quality& qr, const Quality& qa, const char* qname,
             const Thresholds& t, Json& j, std::ostream& out) {
  std::vector<ValidateCheck> checks{
      {"baseline: FP32 reference finite", e.baseline_rows.empty(),
       std::to_string(e.baseline_rows.size()) + " rows with non-finite reference scores"},
      {"amp: no non-finite value", e.amp_nonfinite_rows == 0,
       amp_nonfinite_detail(e.amp_nonfinite_rows, e.nonfinite_rows.size())},
      {"scores within tolerance", e.tol_rows.empty(), std::to_string(e.tol_rows.size()) + " rows outside"},
      {"changed decisions <= max-flips", flips <= t.max_flips,
       std::to_string(flips) + " changed, at most " + std::to_string(t.max_flips) + " allowed"},
  };
  if (std::isfinite(t.min_quality)) {
    checks.push_back({"baseline: quality >= min-quality", qr.value >= t.min_quality,
                      std::string(qname) + " " + std::to_string(qr.value)});
    checks.push_back({"amp: quality >= min-quality", qa.value >= t.min_quality,
                      std::string(qname) + " " + std::to_string(qa.value)});
  }
  bool pass = true;
  const Json cj = print_checks(checks, pass, out);
  if (!e.baseline_rows.empty())
    out << "  the FP32 reference itself is not finite: a failure of the baseline, not of AMP; fix the model or the set "
           "first\n";
  j["checks"] = cj;
  j["pass"] = pass;
}

// Compares the AMP scores with the reference on the set, prints the tables, and returns the
// comparison's part of the report with `pass` set. The thresholds were printed before.
Json compare(const EvalSet& set, const std::vector<float>& ref, const std::vector<float>& amp, const Thresholds& t,
             const char* ref_label, const char* amp_label, std::ostream& out) {
  const Scores sc{set, ref, amp, set.outputs};
  const ScoreErrors e = score_errors(sc, t);
  Json j;
  j["outputs"] = outputs_table(e, sc.k, ref_label, amp_label, out);
  j["baseline_nonfinite_rows"] =
      list_rows(sc, "rows where the FP32 REFERENCE is not finite (a baseline failure)", e.baseline_rows, out);
  j["nonfinite_rows"] = list_rows(sc, "rows where the AMP run is not finite", e.nonfinite_rows, out);
  j["out_of_tolerance_rows"] = list_rows(sc, "rows outside the score tolerance", e.tol_rows, out);
  const int64_t flips = compare_decisions(sc, t, j, out);
  const Quality qr = quality_of(set, ref), qa = quality_of(set, amp);
  const char* qname = set.classification ? "accuracy" : "r2";
  out << "\nquality: " << (set.classification ? "cross-entropy" : "mse") << " " << std::setprecision(6) << qr.loss
      << " (" << ref_label << ") vs " << qa.loss << " (" << amp_label << "); " << qname << " " << qr.value << " vs "
      << qa.value << "\n";
  j["quality"] = {{"measure", qname},         {"loss", set.classification ? "cross_entropy" : "mse"},
                  {"ref_loss", num(qr.loss)}, {"amp_loss", num(qa.loss)},
                  {"ref", num(qr.value)},     {"amp", num(qa.value)}};
  verdict(e, flips, qr, qa, qname, t, j, out);
  return j;
}

void load_flat(Module& model, const std::vector<float>& flat) {
  size_t at = 0;
  for (const Var& p : model.parameters()) {
    const int64_t n = p.master().numel();
    if (at + static_cast<size_t>(n) > flat.size()) throw Error("validate: trained weights do not match the model");
    std::vector<float> v(flat.begin() + static_cast<long>(at), flat.begin() + static_cast<long>(at + n));
    const_cast<Tensor&>(p.master()).copy_from(Tensor::from_vector(v, p.master().shape()));
    Var(p).set_working_dtype(DType::F32);
    at += static_cast<size_t>(n);
  }
}

// Scale statistics of a run's rows: min, max and how many times it fell.
Json scale_stats(const TrainResult& r, float init_scale) {
  float lo = INFINITY, hi = -INFINITY, prev = init_scale;
  int64_t backoffs = 0;
  for (const StepRow& row : r.rows) {
    lo = std::min(lo, row.scaler_scale);
    hi = std::max(hi, row.scaler_scale);
    if (row.scaler_scale < prev) ++backoffs;
    prev = row.scaler_scale;
  }
  return Json{{"min", lo}, {"max", hi}, {"backoffs", backoffs}};
}

// Every option checked before any work; returns the model's config (from --checkpoint, or
// the options), checked as train checks it.
TrainConfig checked_model_config(const ValidateConfig& c) {
  if (c.dtype == DType::F32)
    throw UsageError("validate compares fp16 or bf16 with the FP32 reference: give --dtype fp16|bf16");
  if (!c.init.empty() && !c.checkpoint.empty())
    throw UsageError("--init and --checkpoint both give the model: pick one");
  if (!c.data.empty() && !c.save_set.empty())
    throw UsageError("--save-set writes a generated set; with --data there is none");
  if (c.max_flips < 0) throw UsageError("--max-flips must be >= 0");
  if (c.train_steps < 0) throw UsageError("--train must be >= 0");
  check_threshold("--rtol", c.rtol);
  check_threshold("--atol", c.atol);
  check_threshold("--tie-margin", c.tie_margin);
  if (c.rtol == 0.0 && c.atol == 0.0) throw UsageError("--rtol and --atol are both 0: no rounding would pass");
  if (!c.json.empty()) check_writable(c.json);
  const TrainConfig mc = model_config(c);
  TrainConfig check = mc;  // the shape checks of train
  check.steps = std::max<int64_t>(1, c.train_steps);
  check.batch = c.batch;
  check.lr = c.lr;
  check_train_config(check);
  return mc;
}

// The model, the set and the thresholds: into the report, and printed before either run.
void describe(const ValidateConfig& c, const TrainConfig& mc, const Module& model, const EvalSet& set,
              const Thresholds& t, Json& report, std::ostream& out) {
  const std::string model_from = !c.checkpoint.empty()
                                     ? "checkpoint '" + c.checkpoint + "'"
                                     : (!c.init.empty() ? "'" + c.init + "'" : "seed " + std::to_string(c.seed));
  report["model"] = {{"kind", mc.model},
                     {"in", mc.in_features},
                     {"out", mc.out_features},
                     {"from", model_from},
                     {"parameters", model.parameter_count()}};
  for (const ShapeField& f : model_kind(mc.model).shape)  // its own sizes, beyond in and out
    if (!report["model"].contains(f.name)) report["model"][f.name] = f.get(mc);
  std::map<std::string, int64_t> kinds;
  for (int64_t k : set.kind) ++kinds[kind_name(k)];
  report["set"] = {{"source", set.source},
                   {"rows", set.rows()},
                   {"kinds", kinds},
                   {"task", set.classification ? "classification" : "regression"}};
  report["dtype"] = dtype_name(c.dtype);
  report["fp32_ops"] = c.fp32_ops ? fp32_ops_names(c.fp32_ops) : "none";
  report["thresholds"] = {{"rtol", t.rtol},
                          {"atol", t.atol},
                          {"max_flips", t.max_flips},
                          {"min_quality", std::isfinite(t.min_quality) ? Json(t.min_quality) : Json("none")},
                          {"tie_margin", t.tie_margin},
                          {"nonfinite_allowed", 0}};
  // The thresholds, fixed and printed before either run.
  out << "belay validate: " << mc.model << " " << model.parameter_count() << " parameters (" << model_from << "), "
      << dtype_name(c.dtype) << " autocast vs fp32";
  if (c.fp32_ops) out << ", fp32 ops " << fp32_ops_names(c.fp32_ops);
  out << "\nset: " << set.source << ", " << set.rows() << " rows";
  bool first = true;
  for (auto& [k, v] : kinds) out << (first ? " (" : ", ") << v << " " << k, first = false;
  out << (kinds.empty() ? "" : ")") << ", " << (set.classification ? "class labels" : "regression targets") << "\n";
  out << "thresholds (fixed before the runs): |amp - ref| <= atol " << t.atol << " + rtol " << t.rtol
      << " * max|ref| of the row; no non-finite value; changed decisions <= " << t.max_flips << "; near-tie margin "
      << t.tie_margin << "; min quality "
      << (std::isfinite(t.min_quality) ? std::to_string(t.min_quality) : std::string("none")) << " ("
      << (set.classification ? "accuracy" : "R^2") << ")\n";
  out.flush();
}

// What --train trains on. Generated: a training set of its own (ordinary rows from the same
// teacher); a given set is trained on as it is.
EvalSet training_set(const ValidateConfig& c, const TrainConfig& mc, Module& model, const EvalSet& set,
                     const Thresholds& t) {
  EvalSet train_set = set;
  if (c.data.empty()) {
    ValidateConfig gc = c;
    gc.rows = std::max<int64_t>(4 * c.batch, 256);
    EvalSet g = generate_set(gc, mc, model, t.tie_margin, 1);
    const int64_t n = gc.rows;  // the ordinary rows come first
    train_set.x = g.x.copy_rows(0, n);
    train_set.y.assign(g.y.begin(), g.y.begin() + n);
  }
  if (train_set.rows() < c.batch)
    throw UsageError("the training set has " + std::to_string(train_set.rows()) + " rows, fewer than --batch " +
                     std::to_string(c.batch));
  return train_set;
}

// How far apart the two runs' final weights are: max |amp - fp32| and the relative L2.
std::pair<double, double> weight_divergence(const TrainResult& r32, const TrainResult& ramp) {
  double max_diff = 0, diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < r32.final_weights.size(); ++i) {
    const double d = static_cast<double>(ramp.final_weights[i]) - r32.final_weights[i];
    max_diff = std::max(max_diff, std::fabs(d));
    diff2 += d * d;
    ref2 += static_cast<double>(r32.final_weights[i]) * r32.final_weights[i];
  }
  return {max_diff, ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2)};
}

// The two runs of --train: their losses every tenth of the run, scale and skips, divergence.
void print_training(const ValidateConfig& c, const TrainResult& r32, const TrainResult& ramp, const TrainConfig& t32,
                    const TrainConfig& tamp, const Json& runs, std::pair<double, double> divergence, std::ostream& out) {
  out << "\ntraining " << c.train_steps << " steps from the same init and data (adamw lr " << c.lr << ", batch "
      << c.batch << "):\n  step   loss fp32     loss " << dtype_name(c.dtype) << "\n";
  const int64_t every = std::max<int64_t>(1, c.train_steps / 10);
  for (int64_t s = 0; s < c.train_steps; ++s)
    if (s % every == 0 || s + 1 == c.train_steps)
      out << "  " << std::setw(5) << s << "  " << std::left << std::setw(13) << std::setprecision(6)
          << r32.rows[s].loss << ramp.rows[s].loss << std::right << "\n";
  for (auto [name, r, so] : {std::tuple{"fp32", &r32, &t32}, std::tuple{dtype_name(c.dtype), &ramp, &tamp}}) {
    const Json sc = runs[name]["scale"];
    out << "  " << name << ": " << r->rows.size() - r->skipped << " applied, " << r->skipped << " skipped; scale min "
        << sc["min"].get<float>() << ", max " << sc["max"].get<float>() << ", " << sc["backoffs"].get<int64_t>()
        << " backoffs" << (default_scaler_enabled(so->dtype) ? "" : " (no loss scaling)") << "\n";
  }
  out << "  final weights: max |amp - fp32| " << divergence.first << ", relative L2 " << divergence.second << "\n";
}

// --train N: N steps in FP32 and under AMP from the same init and data (two Trainers), then
// the same checks on the final models (the FP32-trained one in FP32 as the reference).
// Returns the comparison's verdict.
bool train_and_compare(const ValidateConfig& c, const TrainConfig& mc, Module& model, const EvalSet& set,
                       const Thresholds& t, Json& report, std::ostream& out) {
  TrainConfig tc = mc;
  tc.steps = c.train_steps;
  tc.batch = c.batch;
  tc.lr = c.lr;
  tc.quiet = true;
  if (!c.checkpoint.empty())
    tc.init = c.checkpoint;
  else if (!c.init.empty())
    tc.init = c.init;
  const EvalSet train_set = training_set(c, mc, model, set, t);
  const Shape yshape = train_set.classification ? Shape{train_set.rows()} : Shape{train_set.rows(), train_set.outputs};
  const Tensor ty = Tensor::from_vector(train_set.y, yshape);
  tc.make_dataset = [&] {
    return make_tensor_dataset(train_set.x, ty, train_set.classification, train_set.outputs, "validate training set");
  };
  if (train_set.classification && !model_kind(tc.model).class_labels)
    throw UsageError("class labels need --model " + model_kind_names(takes_labels) + " (cross-entropy on logits)");
  std::ostringstream sink;
  TrainConfig t32 = tc, tamp = tc;
  t32.dtype = DType::F32;
  tamp.dtype = c.dtype;
  tamp.fp32_ops = c.fp32_ops;
  const TrainResult r32 = Trainer(t32, sink).run(), ramp = Trainer(tamp, sink).run();
  auto curve = [](const TrainResult& r) {
    Json a = Json::array();
    for (const StepRow& row : r.rows) a.push_back(num(row.loss));
    return a;
  };
  const std::pair<double, double> divergence = weight_divergence(r32, ramp);
  Json runs = Json::object();
  for (auto [name, r, so] : {std::tuple{"fp32", &r32, &t32}, std::tuple{dtype_name(c.dtype), &ramp, &tamp}}) {
    runs[name] = {{"loss", curve(*r)},
                  {"steps", r->rows.size()},
                  {"skipped", r->skipped},
                  {"applied", static_cast<int64_t>(r->rows.size()) - r->skipped},
                  {"scale", scale_stats(*r, default_scaler_enabled(so->dtype) ? so->scaler.init_scale : 1.0f)}};
  }
  report["train"] = {{"steps", c.train_steps},
                     {"batch", c.batch},
                     {"lr", c.lr},
                     {"optimizer", "adamw"},
                     {"runs", runs},
                     {"weight_divergence", {{"max_abs", divergence.first}, {"rel_l2", divergence.second}}}};
  print_training(c, r32, ramp, t32, tamp, runs, divergence, out);
  std::unique_ptr<Module> m32 = build_model(c, mc), mamp = build_model(c, mc);
  load_flat(*m32, r32.final_weights);
  load_flat(*mamp, ramp.final_weights);
  const std::vector<float> ref = scores_of(*m32, set.x, DType::F32, 0);
  const std::vector<float> amp = scores_of(*mamp, set.x, c.dtype, c.fp32_ops);
  out << "\nthe final models on the set (the fp32-trained one in fp32 is the reference):";
  report["comparison"] =
      compare(set, ref, amp, t, "fp32-trained", (std::string(dtype_name(c.dtype)) + "-trained").c_str(), out);
  return report["comparison"]["pass"];
}

}  // namespace

void check_threshold(const char* option, const std::optional<double>& value) {
  if (!value || (std::isfinite(*value) && *value >= 0.0)) return;
  std::ostringstream got;
  got << *value;
  throw UsageError(std::string(option) + " must be a finite number >= 0, got " + got.str() +
                   " (leave it out for the dtype's default)");
}

ValidateResult run_validate(const ValidateConfig& c, std::ostream& out) {
  if (validates_gpt(c)) return run_validate_gpt(c, out);
  const TrainConfig mc = checked_model_config(c);
  std::unique_ptr<Module> model = build_model(c, mc);
  const Thresholds t = resolve(c);
  EvalSet set =
      c.data.empty() ? generate_set(c, mc, *model, t.tie_margin) : load_set(c.data, mc.in_features, mc.out_features);
  if (!c.save_set.empty()) save_set(set, c.save_set, t.tie_margin);
  Json report;
  describe(c, mc, *model, set, t, report, out);
  bool pass = true;
  if (c.train_steps == 0) {
    const std::vector<float> ref = scores_of(*model, set.x, DType::F32, 0);
    const std::vector<float> amp = scores_of(*model, set.x, c.dtype, c.fp32_ops);
    report["comparison"] = compare(set, ref, amp, t, "fp32", dtype_name(c.dtype), out);
    pass = report["comparison"]["pass"];
  } else {
    pass = train_and_compare(c, mc, *model, set, t, report, out);
  }
  return conclude_validate(pass, c, std::move(report), "set", out);
}

Json print_checks(const std::vector<ValidateCheck>& checks, bool& pass, std::ostream& out) {
  Json cj = Json::array();
  pass = true;
  out << "\nverdict:\n";
  for (const ValidateCheck& c : checks) {
    out << "  " << (c.pass ? "PASS  " : "FAIL  ") << c.name << " (" << c.detail << ")\n";
    pass = pass && c.pass;
    cj.push_back({{"check", c.name}, {"pass", c.pass}, {"detail", c.detail}});
  }
  return cj;
}

ValidateResult conclude_validate(bool pass, const ValidateConfig& c, nlohmann::json report, const char* what,
                                 std::ostream& out) {
  report["pass"] = pass;
  out << (pass ? "PASS" : "FAIL") << ": " << dtype_name(c.dtype)
      << (pass ? " holds every threshold" : " fails a threshold") << " on this " << what << "\n";
  std::string text = report.dump(2) + "\n";
  if (!c.json.empty()) write_file_atomically(c.json, text);
  return {pass ? 0 : 1, std::move(text)};
}

}  // namespace belay
