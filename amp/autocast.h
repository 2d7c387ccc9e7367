// Autocast: a thread-local policy saying which dtype matrix products run in, and the RAII
// guards that set it. A leaf: autograd reads it, it reads nothing of belay but DType.
//   { belay::Autocast fp16(belay::DType::F16); loss = mse_loss(model(x), y); }
// Under it, matmul/linear take FP16/BF16 inputs, accumulate in FP32 and produce the low
// dtype; exp, log, pow, softmax and the reductions run in FP32; the rest run in the dtype
// they are given (adds of mixed dtypes promote). autocast.cpp's table says which and why.
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
  // The operators of the Python Var (autograd/math_ops.cpp). Those marked "always" in autocast.cpp's
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
  // The transformer's ops (autograd/nn_ops.cpp, autograd/batched_ops.cpp).
  Embedding = 1u << 20,
  LayerNorm = 1u << 21,
  Bmm = 1u << 22,
  Attention = 1u << 23,  // the fused op (autograd/attention_ops.cpp)
};

// What autocast does to an op class's inputs (autocast.cpp's kAutocastTable says which and why).
enum class AutocastRule : uint8_t {
  LowPrecision,  // inputs cast to the autocast dtype (FP16/BF16): the matrix products
  Fp32,          // inputs cast to FP32, result FP32: the ops whose result low precision would ruin
  AsGiven,       // runs in the dtype it is given (mixed dtypes promote): safe in any dtype
};

// One row of the policy table.
struct AutocastEntry {
  const char* name;  // as --fp32-ops spells it
  OpClass op;
  AutocastRule fp16, bf16;  // the rule under Autocast(F16) and under Autocast(BF16)
  const char* why;          // one line: why this rule (and where belay differs from PyTorch)
};
// The table, in OpClass order: the one place the policy lives (README and docs/numerics.md
// show it as a table).
const AutocastEntry* autocast_table(size_t* count);
const char* autocast_rule_name(AutocastRule rule);  // "fp16/bf16", "fp32", "as given"

// "linear,gelu" -> mask; "" -> 0. Throws UsageError naming an unknown class and the known ones.
uint32_t parse_fp32_ops(const std::string& csv);
// The mask as a canonical comma list (the order above), "" for none: what checkpoints record.
std::string fp32_ops_names(uint32_t mask);

struct AutocastPolicy {
  bool enabled = false;
  DType dtype = DType::F16;
  uint32_t fp32_ops = 0;  // op classes kept in FP32 while enabled
  // Op classes forced to the autocast dtype, the table notwithstanding: an experiment that
  // shows what the table protects against (a softmax of logits beyond 65504 in FP16 is NaN).
  // fp32_ops wins where both name a class.
  uint32_t low_ops = 0;
};

AutocastPolicy& autocast_policy();  // this thread's
// The rule an op of this class follows now: AsGiven with autocast off; Fp32 when fp32_ops
// names it; LowPrecision when low_ops names it; else the table's rule for the autocast dtype.
AutocastRule autocast_rule(OpClass op);
// Whether an op of this class must run in FP32 now (autocast_rule(op) == Fp32).
bool autocast_keeps_fp32(OpClass op);

class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true, uint32_t fp32_ops = 0, uint32_t low_ops = 0);
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
