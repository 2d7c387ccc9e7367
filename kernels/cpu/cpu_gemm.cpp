#include "kernels/cpu/cpu_gemm.h"

#include "engine/backend_checks.h"
#include "engine/error.h"
#include "kernels/cpu/isa/gemm_f32.h"

namespace belay {
namespace {

// An FP32 view of a matrix: the tensor itself when it is FP32, else a widened copy taken
// from the caching allocator (reused step after step, so nothing is allocated in steady state).
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }

void run_eigen(CpuIsa isa, const GemmF32Args& g) {
  switch (isa) {
    case CpuIsa::Baseline: isa_baseline::gemm_f32(g); break;
    case CpuIsa::Avx2: isa_avx2::gemm_f32(g); break;
    case CpuIsa::Avx512:
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Amx: isa_avx512::gemm_f32(g); break;  // the same Eigen: it has no BF16 product
  }
}

bool both_bf16(const GemmF32Args& g) { return g.a_type == GemmElem::BF16 && g.b_type == GemmElem::BF16; }

void run_packed(CpuIsa isa, const GemmF32Args& g) {
  switch (isa) {
    case CpuIsa::Baseline: isa_baseline::gemm_packed(g); break;
    case CpuIsa::Avx2: isa_avx2::gemm_packed(g); break;
    case CpuIsa::Avx512: isa_avx512::gemm_packed(g); break;
    case CpuIsa::Avx512Bf16: isa_avx512bf16::gemm_packed(g); break;
    case CpuIsa::Amx:  // tiles for BF16 x BF16; every other product is avx512bf16's
      if (both_bf16(g))
        isa_amx::gemm_amx(g);
      else
        isa_avx512bf16::gemm_packed(g);
      break;
  }
}

void run_amx_emulated(const GemmF32Args& g) {
  if (!both_bf16(g)) throw Error("gemm: the AMX emulator runs BF16 x BF16 products only");
  isa_amx_emulated::gemm_amx(g);
}


void require_path(CpuIsa isa) {
  if (!cpu_isa_available(isa))
    throw Error(std::string("gemm: the ") + cpu_isa_name(isa) + " path cannot run on this CPU");
}

// Checks the arguments, widens the bias, runs `product` (FP32 C) once per batch item and
// rounds to C's dtype. Each item is the unbatched product on pointers moved by the strides,
// so it has that call's bits.
template <class Product>
void run_gemm(const GemmArgs& args, Product&& product) {
  const GemmDims d = check_gemm(args);
  if (!args.a->device().is_cpu()) throw Error("gemm: CPU backend given " + args.a->describe());
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  Tensor& c = *args.c;

  // FP32 result: written in place; otherwise into a scratch rounded once at the end.
  const bool direct = c.dtype() == DType::F32;
  Tensor scratch = direct ? c : Tensor::empty(c.shape(), DType::F32, c.device());
  Tensor bias32;
  if (args.bias) bias32 = as_f32(*args.bias);

  const StoredMatrix sa = stored_matrix(a), sb = stored_matrix(b);
  GemmF32Args g;
  g.a_type = gemm_elem_of(a.dtype());
  g.a_rows = sa.rows;
  g.a_cols = sa.cols;
  g.trans_a = args.trans_a;
  g.b_type = gemm_elem_of(b.dtype());
  g.b_rows = sb.rows;
  g.b_cols = sb.cols;
  g.trans_b = args.trans_b;
  g.accumulate = args.beta == 1.0f;
  g.bias = args.bias ? bias32.data_as<float>() : nullptr;
  const size_t es = dtype_size(a.dtype());
  for (int64_t i = 0; i < args.batch; ++i) {
    g.a = static_cast<const char*>(a.data()) + i * args.stride_a * es;
    g.b = static_cast<const char*>(b.data()) + i * args.stride_b * es;
    g.c = scratch.data_as<float>() + i * d.m * d.n;
    product(g);
  }
  if (!direct) c.copy_from(scratch);
}

}  // namespace

GemmElem gemm_elem_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return GemmElem::F32;
    case DType::F16: return GemmElem::F16;
    case DType::BF16: return GemmElem::BF16;
    default: throw Error(std::string("no CPU product or element kernel for dtype ") + dtype_name(dtype));
  }
}

void cpu_gemm(const GemmArgs& args) {
  const CpuIsa isa = active_cpu_isa();
  run_gemm(args, [isa](const GemmF32Args& g) { run_packed(isa, g); });
}

void cpu_gemm_on(CpuIsa isa, const GemmArgs& args) {
  require_path(isa);
  run_gemm(args, [isa](const GemmF32Args& g) { run_packed(isa, g); });
}

void cpu_gemm_amx_emulated(const GemmArgs& args) { run_gemm(args, run_amx_emulated); }
int amx_emulator_faults() { return isa_amx_emulated::amx_faults(); }
std::string amx_emulator_first_fault() { return isa_amx_emulated::amx_first_fault(); }
void amx_emulator_reset_faults() { isa_amx_emulated::amx_reset_faults(); }

void cpu_gemm_f32_direct(CpuIsa isa, const GemmF32Args& args) {
  require_path(isa);
  if (args.a_type != GemmElem::F32 || args.b_type != GemmElem::F32) throw Error("gemm: Eigen's product takes FP32");
  run_eigen(isa, args);
}

void cpu_gemm_packed_direct(CpuIsa isa, const GemmF32Args& args) {
  require_path(isa);
  run_packed(isa, args);
}

}  // namespace belay
