// The CPU backend's step-scalar ops (kernels/cpu/cpu_kernels.h): one float each, read and
// written in place (CPU "device memory" is host memory).
#include "kernels/common/element_math.h"
#include "kernels/cpu/block_loops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace belay::cpu {

void lookup(const Tensor& table, const Tensor& index, Tensor& out) {
  out.data_as<float>()[0] = table.data_as<const float>()[table_index(scalar_value(index), table.numel())];
}

void count_applied(Tensor& count, const Tensor& found_inf) {
  if (scalar_value(found_inf) == 0.0f) count.data_as<float>()[0] += 1.0f;
}

}  // namespace belay::cpu
