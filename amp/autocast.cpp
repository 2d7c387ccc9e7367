#include "amp/autocast.h"

#include <algorithm>
#include <utility>

#include "engine/error.h"

namespace belay {

namespace {
const std::pair<const char*, OpClass> kOpClasses[] = {
    {"linear", OpClass::Linear}, {"matmul", OpClass::Matmul}, {"add", OpClass::Add},
    {"mul", OpClass::Mul},       {"scale", OpClass::Scale},   {"relu", OpClass::Relu},
    {"gelu", OpClass::Gelu},     {"mse_loss", OpClass::MseLoss}, {"cross_entropy", OpClass::CrossEntropy},
};
}  // namespace

uint32_t parse_fp32_ops(const std::string& csv) {
  uint32_t mask = 0;
  size_t begin = 0;
  while (begin <= csv.size() && !csv.empty()) {
    const size_t end = std::min(csv.find(',', begin), csv.size());
    const std::string name = csv.substr(begin, end - begin);
    bool known = false;
    for (auto& [n, op] : kOpClasses)
      if (name == n) {
        mask |= static_cast<uint32_t>(op);
        known = true;
      }
    if (!known) {
      std::string all;
      for (auto& [n, op] : kOpClasses) all += (all.empty() ? "" : ", ") + std::string(n);
      throw UsageError("--fp32-ops: unknown op class '" + name + "'; known: " + all);
    }
    begin = end + 1;
  }
  return mask;
}

std::string fp32_ops_names(uint32_t mask) {
  std::string out;
  for (auto& [n, op] : kOpClasses)
    if (mask & static_cast<uint32_t>(op)) out += (out.empty() ? "" : ",") + std::string(n);
  return out;
}

AutocastPolicy& autocast_policy() {
  thread_local AutocastPolicy policy;
  return policy;
}

bool autocast_keeps_fp32(OpClass op) {
  const AutocastPolicy& p = autocast_policy();
  return p.enabled && (p.fp32_ops & static_cast<uint32_t>(op)) != 0;
}

Autocast::Autocast(DType dtype, bool enabled, uint32_t fp32_ops) : saved_(autocast_policy()) {
  autocast_policy() = {enabled && dtype != DType::F32, dtype, fp32_ops};
}
Autocast::~Autocast() { autocast_policy() = saved_; }

AutocastOff::AutocastOff() : saved_(autocast_policy()) { autocast_policy().enabled = false; }
AutocastOff::~AutocastOff() { autocast_policy() = saved_; }

}  // namespace belay
