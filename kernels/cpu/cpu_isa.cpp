#include "kernels/cpu/cpu_isa.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "engine/backend.h"
#include "engine/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <asm/prctl.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BELAY_ISA_X86 1
#else
#define BELAY_ISA_X86 0
#endif

namespace belay {
namespace {

#if BELAY_ISA_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}
// XCR0: which register states the OS saves. Read only when cpuid says OSXSAVE (else the
// instruction faults). Inline asm, so this file needs no -mxsave.
uint64_t xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// Linux keeps the AMX tile data (8 KB of state) off until a process asks for it; the first
// tile instruction without it faults (SIGILL). Asked once, for the whole process, and only on
// a CPU and OS with AMX. 18: XFEATURE_XTILEDATA.
bool request_amx_permission() {
#if defined(__linux__) && defined(ARCH_REQ_XCOMP_PERM)
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, 18) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if BELAY_ISA_X86
  const unsigned max_leaf = cpuid(0, 0).a;
  const Regs l1 = cpuid(1, 0);
  f.sse2 = bit(l1.d, 26);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t x = osxsave ? xcr0() : 0;
  f.os_ymm = (x & 0x6) == 0x6;             // SSE + AVX state
  f.os_zmm = f.os_ymm && (x & 0xe0) == 0xe0;  // opmask, upper ZMM0-15, ZMM16-31
  f.os_amx = (x & 0x60000) == 0x60000;     // XTILECFG + XTILEDATA
  f.avx = bit(l1.c, 28);
  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5);
    f.avx512f = bit(l7.b, 16);
    f.avx512dq = bit(l7.b, 17);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512_fp16 = bit(l7.d, 23);
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_tile = bit(l7.d, 24);
    if (l7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }
  if (f.amx_tile && f.amx_bf16 && f.os_amx) f.amx_permitted = request_amx_permission();
#endif
  return f;
}

std::atomic<int> g_active{-1};
std::once_flag g_decided;

std::string available_list() {
  std::string s;
  for (CpuIsa i : kAllCpuIsas)
    if (cpu_isa_available(i)) s += (s.empty() ? "" : ", ") + std::string(cpu_isa_name(i));
  return s;
}

// UsageError unless the path can run here.
void require_available(CpuIsa isa, const std::string& asked_by) {
  const std::vector<std::string> missing = cpu_isa_missing(isa);
  if (missing.empty()) return;
  std::string m;
  for (const std::string& s : missing) m += (m.empty() ? "" : ", ") + s;
  throw UsageError(asked_by + " asks for the " + cpu_isa_name(isa) + " path, but this machine lacks " + m +
                   " (available here: " + available_list() + ")");
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Baseline: return "baseline";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512bf16";
    case CpuIsa::Amx: return "amx";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& name) {
  for (CpuIsa i : kAllCpuIsas)
    if (name == cpu_isa_name(i)) return i;
  throw UsageError("unknown cpu isa '" + name + "': use baseline, avx2, avx512, avx512bf16 or amx");
}

std::vector<std::string> cpu_isa_missing(CpuIsa isa) {
  const CpuFeatures& f = cpu_features();
  std::vector<std::string> m;
  auto need = [&](bool have, const char* what) {
    if (!have) m.push_back(what);
  };
#if !BELAY_ISA_X86
  if (isa != CpuIsa::Baseline) m.push_back("an x86-64 CPU");
  return m;
#endif
  if (isa >= CpuIsa::Avx2) {
    need(f.avx, "avx");
    need(f.avx2, "avx2");
    need(f.fma, "fma");
    need(f.f16c, "f16c");
    if (m.empty()) need(f.os_ymm, "OS support of the YMM state (xgetbv)");
  }
  if (isa >= CpuIsa::Avx512) {
    need(f.avx512f, "avx512f");
    need(f.avx512bw, "avx512bw");
    need(f.avx512vl, "avx512vl");
    need(f.avx512dq, "avx512dq");
    if (m.empty()) need(f.os_zmm, "OS support of the ZMM/opmask state (xgetbv)");
  }
  if (isa >= CpuIsa::Avx512Bf16) need(f.avx512_bf16, "avx512_bf16");
  if (isa >= CpuIsa::Amx) {
    need(f.amx_tile, "amx_tile");
    need(f.amx_bf16, "amx_bf16");
    if (m.empty()) need(f.os_amx, "OS support of the AMX tile state (xgetbv)");
    if (m.empty()) need(f.amx_permitted, "Linux's permission for the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)");
  }
  return m;
}

bool cpu_isa_available(CpuIsa isa) { return cpu_isa_missing(isa).empty(); }

CpuIsa best_cpu_isa() {
  CpuIsa best = CpuIsa::Baseline;
  for (CpuIsa i : kAllCpuIsas)
    if (cpu_isa_available(i)) best = i;
  return best;
}

CpuIsa active_cpu_isa() {
  const int a = g_active.load(std::memory_order_acquire);
  if (a >= 0) return static_cast<CpuIsa>(a);
  std::call_once(g_decided, [] {  // an exception leaves it undecided: the next use throws again
    CpuIsa isa = best_cpu_isa();
    if (const char* env = std::getenv("BELAY_CPU_ISA"); env && *env) {
      try {
        isa = parse_cpu_isa(env);
      } catch (const UsageError& e) {
        throw UsageError(std::string("BELAY_CPU_ISA: ") + e.what());
      }
      require_available(isa, std::string("BELAY_CPU_ISA=") + env);
    }
    int expected = -1;  // a force_cpu_isa that came first wins
    g_active.compare_exchange_strong(expected, static_cast<int>(isa), std::memory_order_acq_rel);
  });
  return static_cast<CpuIsa>(g_active.load(std::memory_order_acquire));
}

void force_cpu_isa(CpuIsa isa) {
  require_available(isa, std::string("--cpu-isa ") + cpu_isa_name(isa));
  g_active.store(static_cast<int>(isa), std::memory_order_release);
}

std::string cpu_features_string() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool have, const char* name) {
    if (!have) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.sse2, "sse2");
  add(f.avx && f.os_ymm, "avx");
  add(f.avx2 && f.os_ymm, "avx2");
  add(f.fma && f.os_ymm, "fma");
  add(f.f16c && f.os_ymm, "f16c");
  const bool z = f.os_zmm;
  add(f.avx512f && z, "avx512f");
  add(f.avx512bw && z, "avx512bw");
  add(f.avx512vl && z, "avx512vl");
  add(f.avx512dq && z, "avx512dq");
  add(f.avx512_bf16 && z, "avx512_bf16");
  add(f.avx512_fp16 && z, "avx512_fp16");
  add(f.amx_tile && f.os_amx, "amx_tile");
  add(f.amx_bf16 && f.os_amx, "amx_bf16");
  return s.empty() ? "no vector extensions" : s;
}

std::string cpu_isa_report() {
  return std::string(cpu_isa_name(active_cpu_isa())) + " (cpu has: " + cpu_features_string() + ")";
}

// engine/backend.h's doors for the CLI.
void select_cpu_isa(const std::string& name) { force_cpu_isa(parse_cpu_isa(name)); }
std::string cpu_isa_line() { return cpu_isa_report(); }
std::string active_cpu_isa_name() { return cpu_isa_name(active_cpu_isa()); }

}  // namespace belay
