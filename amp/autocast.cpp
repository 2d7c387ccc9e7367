#include "amp/autocast.h"

#include <algorithm>
#include <utility>

#include "engine/error.h"

namespace belay {

namespace {
constexpr AutocastRule kLow = AutocastRule::LowPrecision, kF32 = AutocastRule::Fp32, kGiven = AutocastRule::AsGiven;

// THE autocast policy: each op class, the rule it follows under Autocast(F16) and under
// Autocast(BF16), and why. The reference is PyTorch's aten/src/ATen/autocast_mode.cpp (and
// autocast_mode.h): its lower_precision_fp list (mm, matmul, linear, bmm, ...), its fp32 list
// (exp, log, pow, layer_norm, mse_loss, nll_loss, ...), its fp32_set_opt_dtype list (softmax,
// log_softmax, sum, prod, cumsum, ...), and everything unlisted (add, mul, relu, gelu, tanh,
// embedding) running in the dtype it is given. Where belay differs, the row says so:
// belay's loss and LayerNorm kernels compute in FP32 (or double) whatever the input dtype, so
// casting their inputs to FP32 first would only cost a pass over memory. FP16 and BF16 follow
// the same rules today; the two columns exist so that one can differ (BF16's range is FP32's,
// FP16 overflows from 65504) without another mechanism.
const AutocastEntry kAutocastTable[] = {
    {"linear", OpClass::Linear, kLow, kLow, "tensor-core product; FP32 accumulation, one rounding (PyTorch: lower_precision_fp)"},
    {"matmul", OpClass::Matmul, kLow, kLow, "tensor-core product; FP32 accumulation, one rounding (PyTorch: lower_precision_fp)"},
    {"add", OpClass::Add, kGiven, kGiven, "one rounding per element; mixed dtypes promote to FP32 (PyTorch: unlisted)"},
    {"mul", OpClass::Mul, kGiven, kGiven, "one rounding per element (PyTorch: unlisted)"},
    {"scale", OpClass::Scale, kGiven, kGiven, "one rounding per element (PyTorch: unlisted)"},
    {"relu", OpClass::Relu, kGiven, kGiven, "exact in any dtype (PyTorch: unlisted)"},
    {"gelu", OpClass::Gelu, kGiven, kGiven, "computed in FP32, rounded once; |gelu(x)| <= |x| (PyTorch: unlisted)"},
    {"mse_loss", OpClass::MseLoss, kGiven, kGiven,
     "PyTorch: fp32; belay's kernel sums in double from any dtype and returns FP32, so no input cast"},
    {"cross_entropy", OpClass::CrossEntropy, kGiven, kGiven,
     "PyTorch: fp32 (log_softmax + nll_loss); belay's fused kernel reads any dtype and works in FP32 (a row widened at a time), loss FP32"},
    {"sub", OpClass::Sub, kGiven, kGiven, "one rounding per element (PyTorch: unlisted)"},
    {"div", OpClass::Div, kGiven, kGiven, "one rounding per element (PyTorch: unlisted)"},
    {"exp", OpClass::Exp, kF32, kF32, "overflows FP16 from 11.1 (PyTorch: fp32)"},
    {"log", OpClass::Log, kF32, kF32, "its inputs near 0 are subnormal or 0 in FP16 (PyTorch: fp32)"},
    {"tanh", OpClass::Tanh, kGiven, kGiven, "bounded by 1, computed in FP32, rounded once (PyTorch: unlisted)"},
    {"sigmoid", OpClass::Sigmoid, kGiven, kGiven, "bounded by 1, computed in FP32, rounded once (PyTorch: unlisted)"},
    {"pow", OpClass::Pow, kF32, kF32, "x^2 overflows FP16 from 256 (PyTorch: fp32)"},
    {"softmax", OpClass::Softmax, kF32, kF32,
     "attention logits beyond 65504 are inf in FP16, and inf - inf is NaN (PyTorch: fp32_set_opt_dtype)"},
    {"log_softmax", OpClass::LogSoftmax, kF32, kF32,
     "log-probabilities below -65504 are -inf in FP16 (PyTorch: fp32_set_opt_dtype)"},
    {"sum", OpClass::Sum, kF32, kF32, "a sum of many terms loses their low bits and overflows (PyTorch: fp32_set_opt_dtype)"},
    {"mean", OpClass::Mean, kF32, kF32, "as sum (PyTorch: fp32_set_opt_dtype for sum; mean unlisted)"},
    {"embedding", OpClass::Embedding, kGiven, kGiven,
     "a gather: copies rows, no arithmetic; the output has the table's dtype, so an FP32 table keeps an FP32 "
     "residual stream (PyTorch: unlisted)"},
    {"layer_norm", OpClass::LayerNorm, kGiven, kGiven,
     "PyTorch: fp32 (output FP32); belay's kernel takes mean and variance in FP32 from any dtype and rounds once "
     "into the input's dtype, so no input cast and no FP32 copy of the activations"},
    {"bmm", OpClass::Bmm, kLow, kLow,
     "attention's batched products on the tensor cores; FP32 accumulation, one rounding (PyTorch: "
     "lower_precision_fp)"},
    {"attention", OpClass::Attention, kLow, kLow,
     "the fused op: q, k, v in the low dtype for the products; the scores, the running max and sum and the "
     "rescaling in FP32 inside the kernel, so no FP16 score can overflow (PyTorch: scaled_dot_product_attention "
     "is lower_precision_fp)"},
};

const AutocastEntry* find_entry(OpClass op) {
  for (const AutocastEntry& e : kAutocastTable)
    if (e.op == op) return &e;
  return nullptr;
}
}  // namespace

const AutocastEntry* autocast_table(size_t* count) {
  *count = sizeof(kAutocastTable) / sizeof(kAutocastTable[0]);
  return kAutocastTable;
}

const char* autocast_rule_name(AutocastRule rule) {
  switch (rule) {
    case AutocastRule::LowPrecision: return "fp16/bf16";
    case AutocastRule::Fp32: return "fp32";
    default: return "as given";
  }
}

uint32_t parse_fp32_ops(const std::string& csv) {
  uint32_t mask = 0;
  size_t begin = 0;
  while (begin <= csv.size() && !csv.empty()) {
    const size_t end = std::min(csv.find(',', begin), csv.size());
    const std::string name = csv.substr(begin, end - begin);
    bool known = false;
    for (const AutocastEntry& e : kAutocastTable)
      if (name == e.name) {
        mask |= static_cast<uint32_t>(e.op);
        known = true;
      }
    if (!known) {
      std::string all;
      for (const AutocastEntry& e : kAutocastTable) all += (all.empty() ? "" : ", ") + std::string(e.name);
      throw UsageError("--fp32-ops: unknown op class '" + name + "'; known: " + all);
    }
    begin = end + 1;
  }
  return mask;
}

std::string fp32_ops_names(uint32_t mask) {
  std::string out;
  for (const AutocastEntry& e : kAutocastTable)
    if (mask & static_cast<uint32_t>(e.op)) out += (out.empty() ? "" : ",") + std::string(e.name);
  return out;
}

AutocastPolicy& autocast_policy() {
  thread_local AutocastPolicy policy;
  return policy;
}

AutocastRule autocast_rule(OpClass op) {
  const AutocastPolicy& p = autocast_policy();
  const uint32_t bit = static_cast<uint32_t>(op);
  if (!p.enabled) return AutocastRule::AsGiven;
  if (p.fp32_ops & bit) return AutocastRule::Fp32;
  if (p.low_ops & bit) return AutocastRule::LowPrecision;
  const AutocastEntry* e = find_entry(op);
  if (!e) return AutocastRule::AsGiven;
  return p.dtype == DType::BF16 ? e->bf16 : e->fp16;
}

bool autocast_keeps_fp32(OpClass op) { return autocast_rule(op) == AutocastRule::Fp32; }

Autocast::Autocast(DType dtype, bool enabled, uint32_t fp32_ops, uint32_t low_ops) : saved_(autocast_policy()) {
  autocast_policy() = {enabled && dtype != DType::F32, dtype, fp32_ops, low_ops};
}
Autocast::~Autocast() { autocast_policy() = saved_; }

AutocastOff::AutocastOff() : saved_(autocast_policy()) { autocast_policy().enabled = false; }
AutocastOff::~AutocastOff() { autocast_policy() = saved_; }

}  // namespace belay
