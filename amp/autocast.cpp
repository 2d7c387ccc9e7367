#include "amp/autocast.h"

#include <algorithm>
#include <utility>

#include "engine/error.h"

namespace belay {

namespace {
// The op classes by name (--fp32-ops), and whether autocast always runs a class in FP32.
// "always": the ops PyTorch's autocast lists as FP32 ops (exp, log, pow, softmax,
// log_softmax, sum, mean...): their results lose most to FP16/BF16 (exp overflows FP16 from
// 11.1, a sum of many terms loses their low bits), so under autocast their inputs are cast to
// FP32 and they return FP32. (sum and mean accumulate in double and return FP32 outside
// autocast too.) The others run in the dtype they are given unless fp32_ops names them.
struct OpClassEntry {
  const char* name;
  OpClass op;
  bool always_fp32;
};
const OpClassEntry kOpClasses[] = {
    {"linear", OpClass::Linear, false},   {"matmul", OpClass::Matmul, false},
    {"add", OpClass::Add, false},         {"mul", OpClass::Mul, false},
    {"scale", OpClass::Scale, false},     {"relu", OpClass::Relu, false},
    {"gelu", OpClass::Gelu, false},       {"mse_loss", OpClass::MseLoss, false},
    {"cross_entropy", OpClass::CrossEntropy, false},
    {"sub", OpClass::Sub, false},         {"div", OpClass::Div, false},
    {"exp", OpClass::Exp, true},          {"log", OpClass::Log, true},
    {"tanh", OpClass::Tanh, false},       {"sigmoid", OpClass::Sigmoid, false},
    {"pow", OpClass::Pow, true},          {"softmax", OpClass::Softmax, true},
    {"log_softmax", OpClass::LogSoftmax, true},
    {"sum", OpClass::Sum, true},          {"mean", OpClass::Mean, true},
};

uint32_t always_fp32_mask() {
  uint32_t mask = 0;
  for (const OpClassEntry& e : kOpClasses)
    if (e.always_fp32) mask |= static_cast<uint32_t>(e.op);
  return mask;
}
}  // namespace

uint32_t parse_fp32_ops(const std::string& csv) {
  uint32_t mask = 0;
  size_t begin = 0;
  while (begin <= csv.size() && !csv.empty()) {
    const size_t end = std::min(csv.find(',', begin), csv.size());
    const std::string name = csv.substr(begin, end - begin);
    bool known = false;
    for (const OpClassEntry& e : kOpClasses)
      if (name == e.name) {
        mask |= static_cast<uint32_t>(e.op);
        known = true;
      }
    if (!known) {
      std::string all;
      for (const OpClassEntry& e : kOpClasses) all += (all.empty() ? "" : ", ") + std::string(e.name);
      throw UsageError("--fp32-ops: unknown op class '" + name + "'; known: " + all);
    }
    begin = end + 1;
  }
  return mask;
}

std::string fp32_ops_names(uint32_t mask) {
  std::string out;
  for (const OpClassEntry& e : kOpClasses)
    if (mask & static_cast<uint32_t>(e.op)) out += (out.empty() ? "" : ",") + std::string(e.name);
  return out;
}

AutocastPolicy& autocast_policy() {
  thread_local AutocastPolicy policy;
  return policy;
}

bool autocast_keeps_fp32(OpClass op) {
  const AutocastPolicy& p = autocast_policy();
  static const uint32_t always = always_fp32_mask();
  return p.enabled && ((p.fp32_ops | always) & static_cast<uint32_t>(op)) != 0;
}

Autocast::Autocast(DType dtype, bool enabled, uint32_t fp32_ops) : saved_(autocast_policy()) {
  autocast_policy() = {enabled && dtype != DType::F32, dtype, fp32_ops};
}
Autocast::~Autocast() { autocast_policy() = saved_; }

AutocastOff::AutocastOff() : saved_(autocast_policy()) { autocast_policy().enabled = false; }
AutocastOff::~AutocastOff() { autocast_policy() = saved_; }

}  // namespace belay
