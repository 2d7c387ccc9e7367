#include "autograd/anomaly.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace belay {

namespace {
thread_local DetectAnomaly* g_scope = nullptr;

struct Scan {
  int64_t infs = 0, nans = 0, first = -1;
  double max_abs = -1.0;  // largest finite |value|; < 0 when there is none
  bool bad() const { return infs + nans > 0; }
};

// One host read of the tensor: counts infs and NaNs, finds the first, and the largest |x|.
Scan scan(const Tensor& t) {
  Scan s;
  if (!t.defined()) return s;
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = v[i];
    if (std::isnan(x))
      ++s.nans;
    else if (std::isinf(x))
      ++s.infs;
    else {
      s.max_abs = std::max(s.max_abs, static_cast<double>(std::fabs(x)));
      continue;
    }
    if (s.first < 0) s.first = static_cast<int64_t>(i);
  }
  return s;
}

AnomalyReport make_report(const char* phase, const std::string& op, const std::string& module,
                          const std::string& tensor, const Tensor& t, const Scan& s) {
  AnomalyReport r;
  r.phase = phase;
  r.op = op;
  r.module = module;
  r.tensor = tensor;
  r.shape = t.shape().str();
  r.dtype = dtype_name(t.dtype());
  r.infs = s.infs;
  r.nans = s.nans;
  r.first_index = s.first;
  if (s.first >= 0 && t.rank() >= 1 && t.numel() > 0) r.first_row = s.first / (t.numel() / t.dim(0));
  r.step = g_scope ? g_scope->step() : -1;
  return r;
}

// Adds what an op read: the largest finite |value| and how many were not finite.
void add_input(AnomalyReport& r, const Tensor& t) {
  if (t.data() == nullptr) return;  // released before anomaly mode began (autograd/graph.h): nothing to read
  const Scan s = scan(t);
  r.max_abs_input = std::max(r.max_abs_input, s.max_abs);
  r.input_nonfinite += s.infs + s.nans;
}

std::string input_label(const Node& in, size_t i) {
  std::string label = "input " + std::to_string(i) + " (";
  label += in.is_leaf ? (in.name.empty() ? "leaf" : in.name) : in.op;
  return label + ")";
}

}  // namespace

std::string AnomalyReport::where() const { return module.empty() ? op : module + " " + op; }

std::string AnomalyReport::summary() const {
  std::ostringstream o;
  o << (scaler_event ? "scaler event" : "anomaly") << " at step " << step << ": " << phase << ", " << where() << ", "
    << tensor << " " << dtype << shape << " has " << infs << " inf and " << nans << " NaN";
  if (first_row >= 0) o << " (first at row " << first_row << ")";
  return o.str();
}

std::string AnomalyReport::describe() const {
  std::ostringstream o;
  o << (scaler_event ? "scaler event (a scaled gradient overflowed: the step is skipped and the scale backs off)"
                     : "anomaly: the first non-finite value")
    << "\n";
  o << "  step        " << step << "\n";
  o << "  phase       " << phase << "\n";
  o << "  op          " << op << "\n";
  o << "  module      " << (module.empty() ? "(top level)" : module) << "\n";
  o << "  tensor      " << tensor << "\n";
  o << "  shape       " << shape << " " << dtype << "\n";
  o << "  inf / NaN   " << infs << " / " << nans << "\n";
  if (first_index >= 0) o << "  first at    element " << first_index << ", row " << first_row << "\n";
  if (max_abs_input >= 0.0 || input_nonfinite > 0) {
    o << "  max |input| " << max_abs_input;
    if (input_nonfinite > 0) o << " (and " << input_nonfinite << " non-finite)";
    o << "\n";
  }
  return o.str();
}

AnomalyError::AnomalyError(AnomalyReport report) : Error(report.summary()), report_(std::move(report)) {}

DetectAnomaly::DetectAnomaly(bool scaled_gradients) : outer_(g_scope), scaled_gradients_(scaled_gradients) {
  g_scope = this;
}
DetectAnomaly::~DetectAnomaly() { g_scope = outer_; }

void DetectAnomaly::set_step(int64_t step) {
  step_ = step;
  backward_muted_ = false;
}

void DetectAnomaly::scaler_event(AnomalyReport report) {
  report.scaler_event = true;
  backward_muted_ = true;
  events_.push_back(report);
  if (on_scaler_event) on_scaler_event(events_.back());
}

bool anomaly_mode_enabled() { return g_scope != nullptr; }

void check_finite(const char* phase, const std::string& op, const std::string& module, const std::string& tensor,
                  const Tensor& t, int64_t row_offset) {
  if (!g_scope) return;
  const Scan s = scan(t);
  if (!s.bad()) return;
  AnomalyReport r = make_report(phase, op, module, tensor, t, s);
  if (r.first_row >= 0) r.first_row += row_offset;
  throw AnomalyError(r);
}

void check_gradient(const std::string& op, const std::string& module, const std::string& tensor, const Tensor& g) {
  if (!g_scope || g_scope->backward_muted()) return;
  const Scan s = scan(g);
  if (!s.bad()) return;
  AnomalyReport r = make_report("backward", op, module, tensor, g, s);
  if (g_scope->scaled_gradients()) return g_scope->scaler_event(r);
  throw AnomalyError(r);
}

void anomaly_check_output(const Node& node, const std::vector<Var>& inputs) {
  const Scan s = scan(node.value);
  if (!s.bad()) return;
  const bool is_loss = std::string(node.op) == "mse_loss" || std::string(node.op) == "cross_entropy";
  AnomalyReport r = make_report(is_loss ? "loss" : "forward", node.op, node.module, "output", node.value, s);
  for (const Var& in : inputs)
    if (in.defined()) add_input(r, in.value());
  throw AnomalyError(r);
}

void anomaly_check_backward(const Node& node) {
  if (g_scope->backward_muted()) return;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const Node& in = *node.inputs[i];
    if (!in.requires_grad) continue;
    const Scan s = scan(in.grad);
    if (!s.bad()) continue;
    AnomalyReport r = make_report("backward", node.op, node.module, "gradient of " + input_label(in, i), in.grad, s);
    // What the backward read: the gradient that arrived and the op's forward inputs.
    add_input(r, node.grad);
    for (const auto& other : node.inputs) add_input(r, other->value);
    if (g_scope->scaled_gradients()) return g_scope->scaler_event(r);
    throw AnomalyError(r);
  }
}

}  // namespace belay
