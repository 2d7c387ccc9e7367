// The differentiable ops. Each computes its value through the backend and records how
// to send its gradient back. Autocast (amp/autocast.h) decides the dtype of matmul and
// linear; losses and reductions always produce FP32.
#pragma once
#include "autograd/graph.h"

namespace belay {

Var cast(const Var& x, DType dtype);
Var matmul(const Var& a, const Var& b);                   // [M, K] x [K, N]
Var linear(const Var& x, const Var& weight, const Var& bias);  // x [B, in], W [out, in], b [out] or undefined
Var add(const Var& a, const Var& b);                      // same shape; mixed dtypes promote to FP32
Var mul(const Var& a, const Var& b);                      // elementwise
Var scale(const Var& a, float s);
Var relu(const Var& x);
Var gelu(const Var& x);
Var sum(const Var& x);   // FP32 [1]
Var mean(const Var& x);  // FP32 [1]
Var mse_loss(const Var& pred, const Tensor& target);  // mean squared error, FP32 [1]
// Mean cross-entropy of logits [B, C]; labels [B] hold class indices (as FP32 values).
Var cross_entropy(const Var& logits, const Tensor& labels);

}  // namespace belay
