#include "kernels/cpu/gemm_blocking.h"

#include <cpuid.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace belay {
namespace {

// The most rows of A per block: larger measured no better. On the 2026-12-04 Xeon (2 MiB L2),
// MC 1020 ran the GPT-2 small products at 0.91-1.07x the speed of MC 288 (median 0.98x, slower on
// 46 of 60; bench/results/cpu-2026-12-04-xeon-gemm-blocking.md), and 144-576 were alike; on
// Zen 3 (512 KiB L2) 288 beat 72 and 144.
constexpr int64_t kMcMax = 288;
// From this L2 size on, an A panel in L1 and the B block in L2 (gemm_blocking.h, a_in_l1):
// measured on the 2 MiB L2 of the AMX Xeon only.
constexpr int64_t kAInL1FromL2 = int64_t{2} << 20;

int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }
int64_t round_down(int64_t x, int64_t to) { return x / to * to; }

// "48K", "2048K", "480M", "1G" (sysfs size files) in bytes; 0 if unreadable.
int64_t parse_size(const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (...) {
    return 0;
  }
  const char unit = used < s.size() ? s[used] : ' ';
  return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
}

// "0-1", "0,2", "3" (sysfs shared_cpu_list): how many CPUs.
int count_cpu_list(const std::string& s) {
  int n = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t used = 0;
    int lo = 0;
    try {
      lo = std::stoi(s.substr(i), &used);
    } catch (...) {
      break;
    }
    i += used;
    int hi = lo;
    if (i < s.size() && s[i] == '-') {
      ++i;
      try {
        hi = std::stoi(s.substr(i), &used);
      } catch (...) {
        break;
      }
      i += used;
    }
    n += hi - lo + 1;
    while (i < s.size() && (s[i] == ',' || s[i] == '\n' || s[i] == ' ')) ++i;
  }
  return n > 0 ? n : 1;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

bool from_sysfs(CpuCaches& c) {
  bool any = false;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level"), type = read_line(dir + "type");
    if (level.empty()) break;
    if (type != "Data" && type != "Unified") continue;
    const int64_t size = parse_size(read_line(dir + "size"));
    const std::string ways_s = read_line(dir + "ways_of_associativity"),
                      line_s = read_line(dir + "coherency_line_size");
    const int ways = ways_s.empty() ? 0 : std::atoi(ways_s.c_str());
    const int shared = count_cpu_list(read_line(dir + "shared_cpu_list"));
    if (!line_s.empty() && std::atoi(line_s.c_str()) > 0) c.line = std::atoi(line_s.c_str());
    if (level == "1") c.l1d = size, c.l1d_ways = ways;
    if (level == "2") c.l2 = size, c.l2_ways = ways, c.l2_shared_by = shared;
    if (level == "3") c.l3 = size, c.l3_shared_by = shared;
    any = any || size > 0;
  }
  return any && c.l1d > 0;
}

// Deterministic cache parameters: leaf 4 (Intel) or 0x8000001D (AMD), the same layout.
bool from_cpuid(CpuCaches& c) {
  unsigned a, b, cc, d;
  if (!__get_cpuid(0, &a, &b, &cc, &d)) return false;
  const bool amd = b == 0x68747541;  // "Auth"enticAMD
  const unsigned leaf = amd ? 0x8000001Du : 4u;
  if (amd) {
    if (!__get_cpuid(0x80000000u, &a, &b, &cc, &d) || a < leaf) return false;
  } else if (a < 4) {
    return false;
  }
  bool any = false;
  for (unsigned sub = 0; sub < 16; ++sub) {
    __cpuid_count(leaf, sub, a, b, cc, d);
    const unsigned type = a & 31u;
    if (type == 0) break;
    if (type == 2) continue;  // instruction cache
    const int level = static_cast<int>((a >> 5) & 7u), shared = static_cast<int>(((a >> 14) & 0xfffu) + 1);
    const int64_t ways = ((b >> 22) & 0x3ffu) + 1, parts = ((b >> 12) & 0x3ffu) + 1, line = (b & 0xfffu) + 1;
    const int64_t size = ways * parts * line * (static_cast<int64_t>(cc) + 1);
    c.line = line;
    if (level == 1) c.l1d = size, c.l1d_ways = static_cast<int>(ways);
    if (level == 2) c.l2 = size, c.l2_ways = static_cast<int>(ways), c.l2_shared_by = shared;
    if (level == 3) c.l3 = size, c.l3_shared_by = shared;
    any = true;
  }
  return any && c.l1d > 0;
}

}  // namespace

GemmBlocking gemm_blocking(const CpuCaches& c, const MicroTile& t) {
  const int64_t f = 4;  // bytes per packed entry (an FP32 value or a BF16 pair)
  const int64_t mr = t.mr > 0 ? t.mr : 1, nr = t.nr > 0 ? t.nr : 1;
  const int64_t l1 = c.l1d > 0 ? c.l1d : int64_t{32} << 10;
  // L2 counts whole even where hyperthreads share it: halving it would take Zen 3 (512 KiB per
  // core, two threads) from MC 252 to 120, and 144 measured slower than 288 there. The L3 is
  // shared by many cores, so a thread counts its share.
  const int64_t l2 = c.l2 > 0 ? c.l2 : int64_t{512} << 10;
  const int64_t l3 = c.l3 > 0 ? c.l3 / (c.l3_shared_by > 1 ? c.l3_shared_by : 1) : 0;
  GemmBlocking b;
  b.mr = static_cast<int>(mr);
  b.nr = static_cast<int>(nr);
  const int64_t kc_max = t.kc_max >= 16 ? t.kc_max / 16 * 16 : 16;
  b.kc = static_cast<int>(clamp64(round_down(l1 / 2 / (nr * f), 16), 16, kc_max));
  const int64_t mc_max = kMcMax / mr * mr > 0 ? kMcMax / mr * mr : mr;
  b.mc = static_cast<int>(clamp64(round_down(l2 / 2 / (b.kc * f), mr), mr, mc_max));
  const int64_t nc_max = 4096 / nr * nr > 0 ? 4096 / nr * nr : nr;
  b.a_in_l1 = l2 >= kAInL1FromL2;
  const int64_t b_block_room = b.a_in_l1 ? l2 : (l3 > 0 ? l3 : l2);
  b.nc = static_cast<int>(clamp64(round_down(b_block_room / 2 / (b.kc * f), nr), nr, nc_max));
  return b;
}

GemmBlocking gemm_blocking_for_tile(const GemmBlocking& b, int mr, int nr) {
  GemmBlocking t = b;
  t.mr = mr > 0 ? mr : 1;
  t.nr = nr > 0 ? nr : 1;
  t.mc = b.mc / t.mr * t.mr > 0 ? b.mc / t.mr * t.mr : t.mr;
  t.nc = b.nc / t.nr * t.nr > 0 ? b.nc / t.nr * t.nr : t.nr;
  return t;
}

bool gemm_prefers_wide_tile(int64_t n, int nr_wide) {
  if (n <= 0 || nr_wide <= 0) return false;
  const int64_t padded = (n + nr_wide - 1) / nr_wide * nr_wide;
  return (padded - n) * 50 <= n;
}

const CpuCaches& cpu_caches() {
  static const CpuCaches caches = [] {
    CpuCaches c;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (from_sysfs(c)) {
      c.source = "sysfs";
    } else {
      c = CpuCaches{};
      if (from_cpuid(c)) {
        c.source = "cpuid";
      } else {
        c = CpuCaches{};
        c.source = "defaults";
      }
    }
    c.cores = online > 0 ? static_cast<int>(online) : 1;
    return c;
  }();
  return caches;
}

}  // namespace belay
