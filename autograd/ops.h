// The differentiable ops. Each computes its value through the backend and records how
// to send its gradient back. Autocast (amp/autocast.h) decides the dtype of matmul and
// linear; losses and reductions always produce FP32.
#pragma once
#include <optional>
#include <vector>

#include "autograd/graph.h"
#include "engine/backend.h"

namespace belay {

Var cast(const Var& x, DType dtype);
Var matmul(const Var& a, const Var& b);                   // [M, K] x [K, N]
Var linear(const Var& x, const Var& weight, const Var& bias);  // x [B, in], W [out, in], b [out] or undefined
Var add(const Var& a, const Var& b);                      // broadcasting as binary(); mixed dtypes promote to FP32
Var mul(const Var& a, const Var& b);                      // elementwise, broadcasting as binary()
Var scale(const Var& a, float s);
Var relu(const Var& x);
Var gelu(const Var& x);       // the erf form (PyTorch's default)
Var gelu_tanh(const Var& x);  // the tanh form (PyTorch's approximate='tanh', GPT-2's gelu_new)
Var activation(const Var& x, Activation act);  // one of the three by kind
Var sum(const Var& x);   // FP32 [1]
Var mean(const Var& x);  // FP32 [1]
Var mse_loss(const Var& pred, const Tensor& target);  // mean squared error, FP32 [1]
// Mean cross-entropy of logits [B, C]; labels [B] hold class indices (as FP32 values).
Var cross_entropy(const Var& logits, const Tensor& labels);


// ---- The operators of the Python Var (autograd/math_ops.cpp). Each runs through the
// backend op table, so on every device; each has its backward.
// a op b, elementwise. Shapes either match or one operand broadcasts over the other: a scalar
// (one element), the trailing dims of the other (a row [N] over [M, N]), or the other's shape
// with one run of adjacent dims set to 1 (a column [M, 1] over [M, N]). Anything else is an
// Error naming both shapes.
Var binary(BinaryOp op, const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var div(const Var& a, const Var& b);
Var neg(const Var& x);
Var exp(const Var& x);   // FP32 under autocast (as PyTorch's autocast runs exp)
Var log(const Var& x);   // FP32 under autocast
Var tanh(const Var& x);
Var sigmoid(const Var& x);
Var pow(const Var& x, float p);  // x^p elementwise (FP32 under autocast)
// Softmax and log-softmax over the last dim, computed in FP32 with the row maximum subtracted,
// returned in the input's dtype (FP32 under autocast). causal: x is [..., T, T] attention scores
// and row t keeps columns <= t (the rest: probability 0, log-probability -inf).
Var softmax(const Var& x, bool causal = false);
Var log_softmax(const Var& x, bool causal = false);
// Over one axis (negative counts from the end), FP32 (summed in double). keepdim keeps the
// axis with extent 1.
Var sum(const Var& x, int64_t axis, bool keepdim = false);
Var mean(const Var& x, int64_t axis, bool keepdim = false);
Var transpose(const Var& x);  // a matrix [M, N] -> [N, M] (a copy)
// The same values in another shape (sharing the value's memory); one extent may be -1.
Var reshape(const Var& x, const std::vector<int64_t>& dims);
Var slice_rows(const Var& x, int64_t begin, int64_t end);  // rows [begin, end) of dim 0 (a copy)
Var select_row(const Var& x, int64_t index);               // row `index` of dim 0, that dim dropped

// ---- The transformer's ops (autograd/nn_ops.cpp), each with its backward.
// Rows of table [V, D] picked by ids (any shape; FP32 values holding row indices, as
// cross_entropy's labels): [ids..., D] in the table's dtype (autocast: the dtype it is given).
// The table's gradient is summed in FP32 with the same bits at any thread count.
Var embedding(const Var& table, const Tensor& ids);
// LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias, mean and variance
// in FP32 whatever x's dtype, the result in x's dtype. weight and bias are [D] or undefined.
Var layer_norm(const Var& x, const Var& weight, const Var& bias, float eps = 1e-5f);

// ---- Attention's products and views (autograd/batched_ops.cpp), each with its backward.
// [..., M, K] x [..., K, N] -> [..., M, N], one product per item of the leading dims, which a
// and b share; or b a matrix [K, N], the same for every item (its gradient summed over them).
// trans_a / trans_b: the last two dims of a (b) are read transposed, by the GEMM's layout
// flags, not a copy: Q K^T is bmm(q, k, false, true). Autocast: FP16/BF16 (as matmul).
Var bmm(const Var& a, const Var& b, bool trans_a = false, bool trans_b = false);
// dims dim0 and dim1 swapped (negative counts from the end): one copy (Backend::swap_axes).
Var transpose(const Var& x, int64_t dim0, int64_t dim1);
// Fused attention (autograd/attention_ops.cpp; docs/attention.md): softmax(scale q k^T) v
// for q [..., Tq, d] and k, v [..., Tk, d] with the same leading dims (d <= 128), never
// storing the [Tq, Tk] scores: the backward recomputes them from one FP32 log-sum-exp per
// query row. causal: query i sees keys j <= i + Tk - Tq (the lower triangle when Tq == Tk).
// scale defaults to 1 / sqrt(d). Autocast class `attention`: q, k, v in FP16/BF16, the scores,
// the softmax and the sums in FP32 inside the kernel, the output in the low dtype.
Var attention(const Var& q, const Var& k, const Var& v, bool causal = true, std::optional<float> scale = {});
// The same for H heads side by side, as the Linears give them: q [..., Tq, H d], k and v
// [..., Tk, H d] -> [..., Tq, H d], the bits of merge_heads(attention(split_heads(q, H), ...))
// with no copy to split or merge the heads (the CPU reads them in place). scale defaults to
// 1 / sqrt(d).
Var attention_heads(const Var& q, const Var& k, const Var& v, int64_t heads, bool causal = true,
                    std::optional<float> scale = {});
// [..., T, H * d] -> [..., H, T, d] (reshape, then transpose(-3, -2)), and back.
Var split_heads(const Var& x, int64_t heads);
Var merge_heads(const Var& x);

}  // namespace belay
