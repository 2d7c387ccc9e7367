#include "kernels/cpu/cpu_gemm.h"

#include <iterator>

#include "engine/backend_checks.h"
#include "engine/error.h"
#include "kernels/cpu/env_switch.h"
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

// The path whose packed FP32 product runs on `isa` (amx runs avx512bf16's for all but BF16 x BF16).
CpuIsa packed_path(CpuIsa isa) { return isa == CpuIsa::Amx ? CpuIsa::Avx512Bf16 : isa; }

MicroTile micro_tile(CpuIsa isa) {
  switch (packed_path(isa)) {
    case CpuIsa::Baseline: return isa_baseline::gemm_micro_tile();
    case CpuIsa::Avx2: return isa_avx2::gemm_micro_tile();
    case CpuIsa::Avx512: return isa_avx512::gemm_micro_tile();
    default: return isa_avx512bf16::gemm_micro_tile();
  }
}

GemmBlocking default_blocking(CpuIsa isa) {
  switch (packed_path(isa)) {
    case CpuIsa::Baseline: return isa_baseline::gemm_default_blocking();
    case CpuIsa::Avx2: return isa_avx2::gemm_default_blocking();
    case CpuIsa::Avx512: return isa_avx512::gemm_default_blocking();
    default: return isa_avx512bf16::gemm_default_blocking();
  }
}

// BELAY_GEMM_BLOCKING=fixed: the compiled-in blocking of before the caches were read (the bench
// compares both in one run); unset or "caches": the blocking of the caches read at start.
bool fixed_blocking() {
  static const bool fixed = env_switch("BELAY_GEMM_BLOCKING", {"caches", "fixed"}) == 1;
  return fixed;
}

// BELAY_GEMM_TILE=narrow: every product on the path's own micro-tile (the bench compares it with
// the default in one run); unset or "auto": the AVX-512 paths' wide tile where N fills it.
GemmTile tile_asked() {
  static const GemmTile tile = env_switch("BELAY_GEMM_TILE", {"auto", "narrow"}) == 1 ? GemmTile::Narrow : GemmTile::Auto;
  return tile;
}

void run_packed(CpuIsa isa, const GemmF32Args& args) {
  GemmF32Args g = args;
  g.blocking = cpu_gemm_blocking(isa);
  if (g.tile == GemmTile::Auto) g.tile = tile_asked();  // a caller that names a tile (bench, tests) keeps it
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

// Whether the product writes a BF16 C itself (gemm_amx's rounding, the bits of the cast of its
// FP32 C): the amx path's BF16 x BF16 products with one K block that add nothing into C.
bool tiles_write_bf16(bool on_tiles, const GemmArgs& args, const GemmDims& d) {
  return on_tiles && args.a->dtype() == DType::BF16 && args.b->dtype() == DType::BF16 &&
         args.c->dtype() == DType::BF16 && d.k > 0 && d.k <= kAmxOneBlockK && args.beta != 1.0f;
}

// Checks the arguments, widens the bias, runs `product` (FP32 C) once per batch item and
// rounds to C's dtype. Each item is the unbatched product on pointers moved by the strides,
// so it has that call's bits. `on_tiles`: the product is gemm_amx's (real or emulated) for
// BF16 x BF16, which can round a BF16 C itself.
template <class Product>
void run_gemm(const GemmArgs& args, bool on_tiles, Product&& product) {
  const GemmDims d = check_gemm(args);
  if (!args.a->device().is_cpu()) throw Error("gemm: CPU backend given " + args.a->describe());
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  Tensor& c = *args.c;

  // FP32 result: written in place; a BF16 one the tiles round: in place too; otherwise into a
  // scratch rounded once at the end.
  const bool bf16_direct = tiles_write_bf16(on_tiles, args, d);
  const bool direct = c.dtype() == DType::F32 || bf16_direct;
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
    if (bf16_direct)
      g.c_bf16 = static_cast<uint16_t*>(c.data()) + i * d.m * d.n;
    else
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
  run_gemm(args, isa == CpuIsa::Amx, [isa](const GemmF32Args& g) { run_packed(isa, g); });
}

void cpu_gemm_on(CpuIsa isa, const GemmArgs& args) {
  require_path(isa);
  run_gemm(args, isa == CpuIsa::Amx, [isa](const GemmF32Args& g) { run_packed(isa, g); });
}

GemmBlocking cpu_gemm_blocking(CpuIsa isa) {
  require_path(isa);  // micro_tile() runs the path's own code
  struct Table {
    GemmBlocking of[std::size(kAllCpuIsas)];
    Table() {
      for (const CpuIsa p : kAllCpuIsas)
        if (cpu_isa_available(p)) of[static_cast<int>(p)] = gemm_blocking(cpu_caches(), micro_tile(p));
    }
  };
  static const Table from_caches;
  return fixed_blocking() ? default_blocking(isa) : from_caches.of[static_cast<int>(isa)];
}

std::string cpu_caches_report() {
  const CpuCaches& c = cpu_caches();
  auto size = [](int64_t b) {
    if (b <= 0) return std::string("none");
    if (b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
    return std::to_string(b >> 10) + " KiB";
  };
  auto ways = [](int w) { return w > 0 ? " " + std::to_string(w) + "-way" : std::string(); };
  auto shared = [](int n) { return n > 1 ? " shared by " + std::to_string(n) : std::string(); };
  return "L1d " + size(c.l1d) + ways(c.l1d_ways) + ", L2 " + size(c.l2) + ways(c.l2_ways) + shared(c.l2_shared_by) +
         ", L3 " + size(c.l3) + shared(c.l3_shared_by) + ", " + std::to_string(c.cores) + " CPUs (" + c.source + ")";
}

bool cpu_gemm_has_wide_tile(CpuIsa isa) { return isa >= CpuIsa::Avx512; }

std::string cpu_gemm_blocking_report(CpuIsa isa) {
  const GemmBlocking b = cpu_gemm_blocking(isa);
  // Read on every path, so a bad BELAY_GEMM_TILE is refused where no wide tile exists too (the
  // report's && skipped it off AVX-512: `belay info` exited 0 on Zen 3).
  const GemmTile tile = tile_asked();
  // amx: its BF16 x BF16 products run on tiles (gemm_amx.cpp, blocked on its own); this is the
  // blocking of its other products, on avx512bf16's panels.
  return std::string(cpu_isa_name(isa)) + (isa == CpuIsa::Amx ? " (fp32/fp16 products)" : "") + ": MR " +
         std::to_string(b.mr) + " NR " + std::to_string(b.nr) + " KC " +
         std::to_string(b.kc) + " MC " + std::to_string(b.mc) + " NC " + std::to_string(b.nc) +
         (b.a_in_l1 ? ", an A panel in L1 where a slice is NC / 2 wide" : "") +
         (fixed_blocking() ? " (fixed: BELAY_GEMM_BLOCKING)" : "") +
         (cpu_gemm_has_wide_tile(isa) && tile == GemmTile::Auto
              ? "; MR " + std::to_string(kGemmWideMr) + " NR " + std::to_string(kGemmWideNr) + " where N fills it"
              : "");
}

std::string cpu_gemm_line() {
  return cpu_gemm_blocking_report(active_cpu_isa()) + "; caches " + cpu_caches_report();
}

void cpu_gemm_amx_emulated(const GemmArgs& args) { run_gemm(args, true, run_amx_emulated); }
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
