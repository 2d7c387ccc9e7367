// Autocast: a thread-local policy saying which dtype matrix products run in, and the RAII
// guards that set it. A leaf: autograd reads it, it reads nothing of belay but DType.
//   { belay::Autocast fp16(belay::DType::F16); loss = mse_loss(model(x), y); }
// Under it, matmul/linear take FP16/BF16 inputs, accumulate in FP32 and produce the low
// dtype; losses, reductions and norms stay FP32; adds of mixed dtypes promote.
//
// An op class can be kept in FP32 under autocast (--fp32-ops linear,gelu): its inputs are
// cast to FP32 and it runs and returns FP32, so a user can test whether one op's precision
// causes an overflow without leaving mixed precision for the rest of the model.
//   { belay::Autocast fp16(belay::DType::F16, true, belay::parse_fp32_ops("gelu")); ... }
#pragma once
#include <cstdint>
#include <string>

#include "engine/dtype.h"

namespace belay {

// The op classes autocast can be switched off around (a bit mask).
enum class OpClass : uint32_t {
  Linear = 1u << 0,
  Matmul = 1u << 1,
  Add = 1u << 2,
  Mul = 1u << 3,
  Scale = 1u << 4,
  Relu = 1u << 5,
  Gelu = 1u << 6,
  MseLoss = 1u << 7,
  CrossEntropy = 1u << 8,
  // The operators of the Python Var (issue 27). Those marked "always" in autocast.cpp's
  // table run in FP32 under autocast whether or not fp32_ops names them.
  Sub = 1u << 9,
  Div = 1u << 10,
  Exp = 1u << 11,
  Log = 1u << 12,
  Tanh = 1u << 13,
  Sigmoid = 1u << 14,
  Pow = 1u << 15,
  Softmax = 1u << 16,
  LogSoftmax = 1u << 17,
  Sum = 1u << 18,
  Mean = 1u << 19,
};

// "linear,gelu" -> mask; "" -> 0. Throws UsageError naming an unknown class and the known ones.
uint32_t parse_fp32_ops(const std::string& csv);
// The mask as a canonical comma list (the order above), "" for none: what checkpoints record.
std::string fp32_ops_names(uint32_t mask);

struct AutocastPolicy {
  bool enabled = false;
  DType dtype = DType::F16;
  uint32_t fp32_ops = 0;  // op classes kept in FP32 while enabled
};

AutocastPolicy& autocast_policy();  // this thread's
// Whether an op of this class must run in FP32 now: autocast on and the class kept out of it
// (named in fp32_ops, or one that autocast always runs in FP32).
bool autocast_keeps_fp32(OpClass op);

class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true, uint32_t fp32_ops = 0);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastPolicy saved_;
};

// Switches autocast off around one op (or a few): { AutocastOff off; y = matmul(a, b); }
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  AutocastPolicy saved_;
};

}  // namespace belay
