// One copy of the FP32 product per ISA: BELAY_ISA_NS (isa_baseline, isa_avx2, isa_avx512)
// and BELAY_EIGEN_NS (Eigen_baseline, ...) come from kernels/cpu/isa/isa.cmake, as do the
// -m flags. Eigen is renamed by a macro placed before its include (header names in <...>
// are not macro-expanded), so every Eigen template this file instantiates is a symbol of
// its own ISA; tests/kernels/check_isa_objects.sh checks that no weak symbol escapes.
// Include nothing that instantiates std:: templates here: those would be shared.
#if !defined(BELAY_ISA_NS) || !defined(BELAY_EIGEN_NS)
#error "kernels/cpu/isa/gemm_f32.cpp is built once per ISA by isa.cmake"
#endif
#define Eigen BELAY_EIGEN_NS
#include <Eigen/Core>

#include "kernels/cpu/isa/gemm_f32.h"

namespace belay::BELAY_ISA_NS {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat>;
using MutMap = Eigen::Map<RowMat>;

}  // namespace

void gemm_f32(const GemmF32Args& g) {
  const ConstMap am(static_cast<const float*>(g.a), g.a_rows, g.a_cols);
  const ConstMap bm(static_cast<const float*>(g.b), g.b_rows, g.b_cols);
  const int64_t m = g.trans_a ? g.a_cols : g.a_rows, n = g.trans_b ? g.b_rows : g.b_cols;
  MutMap cm(g.c, m, n);
  auto product = [&](auto&& lhs, auto&& rhs) {
    if (g.accumulate)
      cm.noalias() += lhs * rhs;
    else
      cm.noalias() = lhs * rhs;
  };
  if (!g.trans_a && !g.trans_b) product(am, bm);
  else if (!g.trans_a && g.trans_b) product(am, bm.transpose());
  else if (g.trans_a && !g.trans_b) product(am.transpose(), bm);
  else product(am.transpose(), bm.transpose());
  if (g.bias) cm.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(g.bias, n);
}

}  // namespace belay::BELAY_ISA_NS
