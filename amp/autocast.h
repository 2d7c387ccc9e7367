// Autocast: a thread-local policy saying which dtype matrix products run in, and the RAII
// guards that set it. A leaf: autograd reads it, it reads nothing of belay but DType.
//   { belay::Autocast fp16(belay::DType::F16); loss = mse_loss(model(x), y); }
// Under it, matmul/linear take FP16/BF16 inputs, accumulate in FP32 and produce the low
// dtype; losses, reductions and norms stay FP32; adds of mixed dtypes promote.
#pragma once
#include "engine/dtype.h"

namespace belay {

struct AutocastPolicy {
  bool enabled = false;
  DType dtype = DType::F16;
};

AutocastPolicy& autocast_policy();  // this thread's

class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true);
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
