// Anomaly mode: find the FIRST non-finite value of a training step and say where it came
// from. Under a DetectAnomaly scope every op's output is read on the host as the forward
// makes it (a loss op's output is the "loss" phase), and every gradient an op's backward
// produces is read right after that backward; the trainer adds the input batch and the
// optimizer's result (check_finite). The first inf or NaN throws AnomalyError with a report:
// phase, op and module path ("layers.1 linear"), shape and dtype, inf and NaN counts, the
// largest |value| among the op's inputs, and the step.
//
// With loss scaling on, backward gradients are SCALED: their overflow is what the scaler is
// for (it skips the step and backs off), so it is recorded as a scaler event, not thrown,
// and the rest of that step's backward is not checked.
//
// Off by default: it reads every tensor on the host, so a GPU would synchronise on each op.
// bench/ measures its cost on the CPU.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/graph.h"
#include "engine/error.h"

namespace belay {

struct AnomalyReport {
  std::string phase;   // input | forward | loss | backward | optimizer
  std::string op;      // the op ("linear", "gelu", "mse_loss"), or what was checked ("batch x", "adamw")
  std::string module;  // module path ("layers.1"); empty at the top level
  std::string tensor;  // which tensor: "output", "gradient of input 0 (weight)", "x", ...
  std::string shape;   // "[32, 8]"
  std::string dtype;   // "fp16"
  int64_t infs = 0;
  int64_t nans = 0;
  int64_t first_index = -1;     // flat index of the first non-finite element
  int64_t first_row = -1;       // its row (dim 0) for a tensor of rank >= 1
  double max_abs_input = -1.0;  // largest finite |value| among the op's inputs; < 0: none
  int64_t input_nonfinite = 0;  // non-finite values among the inputs (0 for a first anomaly)
  int64_t step = -1;
  bool scaler_event = false;

  std::string where() const;     // "layers.1 linear" or "linear" at the top level
  std::string describe() const;  // multi-line, for the report
  std::string summary() const;   // one line, for the error
};

class AnomalyError : public Error {
 public:
  explicit AnomalyError(AnomalyReport report);
  const AnomalyReport& report() const { return report_; }

 private:
  AnomalyReport report_;
};

// Enables anomaly mode on this thread for its lifetime (nesting restores the outer one).
class DetectAnomaly {
 public:
  explicit DetectAnomaly(bool scaled_gradients = false);
  ~DetectAnomaly();
  DetectAnomaly(const DetectAnomaly&) = delete;
  DetectAnomaly& operator=(const DetectAnomaly&) = delete;

  // The step reports carry; a new step also re-arms the backward checks after a scaler event.
  void set_step(int64_t step);
  // Called for each scaler event (a scaled gradient overflowed); the default collects them.
  std::function<void(const AnomalyReport&)> on_scaler_event;
  const std::vector<AnomalyReport>& scaler_events() const { return events_; }

  int64_t step() const { return step_; }
  bool scaled_gradients() const { return scaled_gradients_; }
  // A scaled gradient overflowed: record it, and check no more gradients this step.
  void scaler_event(AnomalyReport report);
  bool backward_muted() const { return backward_muted_; }

 private:
  DetectAnomaly* outer_;
  bool scaled_gradients_;
  bool backward_muted_ = false;
  int64_t step_ = -1;
  std::vector<AnomalyReport> events_;
};

bool anomaly_mode_enabled();

// Checks `t` (read on the host) when anomaly mode is on and throws AnomalyError at a
// non-finite value. For the trainer's own checks: the input batch ("input"), the
// optimizer's result ("optimizer"). `row_offset` is added to the reported row (the data row).
void check_finite(const char* phase, const std::string& op, const std::string& module, const std::string& tensor,
                  const Tensor& t, int64_t row_offset = 0);
// Gradients checked outside an op's backward (after the whole backward, e.g. a fault planted
// in a gradient buffer): a scaler event when gradients are scaled, else an anomaly.
void check_gradient(const std::string& op, const std::string& module, const std::string& tensor, const Tensor& g);

// The hooks graph.cpp calls: an op's fresh output, and the gradients its backward produced.
void anomaly_check_output(const Node& node, const std::vector<Var>& inputs);
void anomaly_check_backward(const Node& node);

}  // namespace belay
