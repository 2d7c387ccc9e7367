#include "kernels/cpu/cpu_gemm.h"

#include <Eigen/Core>

#include "engine/error.h"

namespace belay {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat>;
using MutMap = Eigen::Map<RowMat>;

// An FP32 view of a matrix: the tensor itself when it is FP32, else a widened copy taken
// from the caching allocator (reused step after step, so nothing is allocated in steady state).
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }

}  // namespace

void cpu_gemm(const GemmArgs& args) {
  if (!args.a || !args.b || !args.c) throw Error("gemm: missing operand");
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  Tensor& c = *args.c;
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2)
    throw Error("gemm: expected matrices, got " + a.describe() + ", " + b.describe() + ", " + c.describe());
  if (a.dtype() != b.dtype())
    throw Error("gemm: operand dtypes differ, " + a.describe() + " vs " + b.describe() + " (cast one first)");
  const int64_t m = args.trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = args.trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = args.trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = args.trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n)
    throw Error("gemm: shapes do not chain, op(A) is [" + std::to_string(m) + ", " + std::to_string(k) +
                "], op(B) is [" + std::to_string(kb) + ", " + std::to_string(n) + "], C is " + c.describe());
  if (args.beta != 0.0f && (args.beta != 1.0f || c.dtype() != DType::F32))
    throw Error("gemm: beta must be 0, or 1 with an fp32 C (gradient accumulation)");
  if (args.bias && (args.bias->numel() != n))
    throw Error("gemm: bias " + args.bias->describe() + " does not match N = " + std::to_string(n));

  const Tensor a32 = as_f32(a), b32 = as_f32(b);
  const ConstMap am(a32.data_as<float>(), a.dim(0), a.dim(1));
  const ConstMap bm(b32.data_as<float>(), b.dim(0), b.dim(1));
  // FP32 result: written in place; otherwise into a scratch rounded once at the end.
  const bool direct = c.dtype() == DType::F32;
  Tensor scratch = direct ? c : Tensor::empty(c.shape(), DType::F32, c.device());
  MutMap cm(scratch.data_as<float>(), m, n);

  auto product = [&](auto&& lhs, auto&& rhs) {
    if (args.beta == 1.0f)
      cm.noalias() += lhs * rhs;
    else
      cm.noalias() = lhs * rhs;
  };
  if (!args.trans_a && !args.trans_b) product(am, bm);
  else if (!args.trans_a && args.trans_b) product(am, bm.transpose());
  else if (args.trans_a && !args.trans_b) product(am.transpose(), bm);
  else product(am.transpose(), bm.transpose());

  if (args.bias) {
    const Tensor bias32 = as_f32(*args.bias);
    cm.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias32.data_as<float>(), n);
  }
  if (!direct) c.copy_from(scratch);
}

}  // namespace belay
