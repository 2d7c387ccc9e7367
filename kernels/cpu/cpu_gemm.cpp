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
  const auto [m, n, k] = check_gemm(args);
  if (!args.a->device().is_cpu()) throw Error("gemm: CPU backend given " + args.a->describe());
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  Tensor& c = *args.c;

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
