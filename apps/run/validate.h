// `belay validate`: mixed precision checked against the FP32 reference on a fixed set
// (docs/validate.md). The thresholds are fixed and printed before the AMP run; the same forward
// runs in FP32 and under autocast; scores are compared with a tolerance, then decisions
// (argmax, ties to the lowest index) with every changed decision listed; quality on the set
// for both. A non-finite value in the FP32 reference is a failure of the baseline itself.
// With --train N, N steps in FP32 and under AMP from the same init and data first, and the
// same checks on the two final models.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "engine/dtype.h"

namespace belay {

struct ValidateConfig {
  DType dtype = DType::F16;
  // The model: from --checkpoint, else this shape, from --init or seeded.
  std::string model = "mlp";
  int64_t in_features = 16;
  int64_t out_features = 4;  // classes of the generated set
  int64_t hidden = 32;
  int layers = 2;
  uint64_t seed = 0;
  std::string init;
  std::string checkpoint;
  // The set: --data FILE (x, y; an I64 `kind` tensor names each row's kind), or generated:
  // `rows` ordinary rows and rows/4 each of large, near-zero and near-tie rows.
  std::string data;
  int64_t rows = 64;
  std::string save_set;  // write the generated set here (safetensors)
  // Thresholds; unset: the dtype's default (validate.cpp says how it is derived). Given, each
  // must be a finite number >= 0: no value a user can type means "the default".
  std::optional<double> rtol;  // |amp - ref| <= atol + rtol * max|ref| of the row
  std::optional<double> atol;
  int64_t max_flips = 0;
  double min_quality = -std::numeric_limits<double>::infinity();  // accuracy (labels) or R^2
  std::optional<double> tie_margin;  // reference top-2 margin under which a row is a near-tie
  uint32_t fp32_ops = 0;
  std::string json;  // also write the report here
  // --train N: N steps in FP32 and under AMP first (AdamW, this lr and batch).
  int64_t train_steps = 0;
  float lr = 1e-2f;
  int64_t batch = 32;
  // A GPT checkpoint (apps/run/validate_gpt.h): the held-out windows of --data it is run on.
  int64_t windows = 32;
};

struct ValidateResult {
  int exit_code = 0;  // 0: every threshold holds; 1: some does not
  std::string report;  // the report as JSON text, what --json writes
};

// Linear and MLP checkpoints here; a GPT checkpoint goes to run_validate_gpt (validate_gpt.h).
ValidateResult run_validate(const ValidateConfig& config, std::ostream& out);

// A threshold option (--rtol, --atol, --tie-margin): unset, or a finite number >= 0; else
// UsageError naming it.
void check_threshold(const char* option, const std::optional<double>& value);

}  // namespace belay
