// Per-site memory metrics of emulated kernels (memory_metrics.h says what is counted and how).
// One kernel runs at a time (the stream queue is in order), so, like simt.cpp, this keeps
// plain globals and no lock.
#include "kernels/cuda/emulation/memory_metrics.h"

#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace belay::emu::metrics {

bool g_on = [] {
  const char* path = std::getenv("BELAY_EMU_METRICS");
  return path && *path;
}();

namespace {

constexpr int kWarpSize = 32;
constexpr int kBanks = 32;
constexpr uint64_t kSector = 32;

struct Rec {
  uint32_t occurrence;
  uint8_t lane;
  Space space;
  bool vector;
  uint32_t bytes;
  uint64_t address;
};

// The accesses of one instruction by one warp in the running block, not yet counted.
struct Pending {
  uint32_t occurrences[kWarpSize] = {};
  std::vector<Rec> recs;
};
struct PendingKey {
  const void* site;
  int warp;
  bool write;
  bool operator==(const PendingKey& o) const { return site == o.site && warp == o.warp && write == o.write; }
};
struct PendingHash {
  size_t operator()(const PendingKey& k) const {
    return std::hash<const void*>()(k.site) ^ (static_cast<size_t>(k.warp) << 1 | k.write) * 0x9e3779b97f4a7c15ull;
  }
};

struct Totals {
  int64_t requests = 0, bytes = 0, wavefronts = 0, ideal_wavefronts = 0, sectors = 0, ideal_sectors = 0;
  bool vector = true;
};
using SiteKey = std::tuple<std::string, const void*, Space, bool>;  // kernel, instruction, space, write

// The hooked parts of a vector access already counted at its site.
struct Cover {
  uintptr_t lo = 0, hi = 0;
  uint32_t budget = 0;
};

struct State {
  std::string kernel;
  std::unordered_map<PendingKey, Pending, PendingHash> pending;
  std::map<SiteKey, Totals> totals;
  std::unordered_set<uint64_t> read_sectors, written_sectors;  // of the running launch
  int64_t mma = 0;
  std::vector<LaunchStats> launches;
  std::vector<Cover> covers;  // per thread of the running block
  ~State();
};
State& state() {
  static State s;
  return s;
}

// Distinct bytes and 32-byte sectors of a set of [address, address + bytes) ranges.
struct Footprint {
  int64_t bytes = 0, sectors = 0;
};
Footprint footprint(std::vector<std::pair<uint64_t, uint64_t>>& ranges, std::unordered_set<uint64_t>* launch_sectors) {
  std::sort(ranges.begin(), ranges.end());
  Footprint f;
  uint64_t end = 0, last_sector = UINT64_MAX;
  for (auto [lo, hi] : ranges) {
    lo = std::max(lo, end);
    if (lo >= hi) continue;
    f.bytes += static_cast<int64_t>(hi - lo);
    end = hi;
    for (uint64_t s = lo / kSector; s <= (hi - 1) / kSector; ++s) {
      if (s == last_sector) continue;
      last_sector = s;
      ++f.sectors;
      if (launch_sectors) launch_sectors->insert(s);
    }
  }
  return f;
}

// Shared memory: phases of 32, 16 or 8 lanes (by the widest access); within a phase each bank
// serves its distinct 4-byte words one per wavefront (one word read by several lanes is a
// broadcast, not a conflict).
void count_shared(const std::vector<const Rec*>& recs, Totals& t) {
  uint32_t widest = 0;
  for (const Rec* r : recs) widest = std::max(widest, r->bytes);
  const int lanes_per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int phase = 0; phase < kWarpSize / lanes_per_phase; ++phase) {
    std::set<uint64_t> words;
    for (const Rec* r : recs)
      if (r->lane / lanes_per_phase == phase)
        for (uint64_t w = r->address / 4; w <= (r->address + r->bytes - 1) / 4; ++w) words.insert(w);
    if (words.empty()) continue;
    int per_bank[kBanks] = {};
    int wavefronts = 0;
    for (uint64_t w : words) wavefronts = std::max(wavefronts, ++per_bank[w % kBanks]);
    t.wavefronts += wavefronts;
    t.ideal_wavefronts += 1;
  }
  for (const Rec* r : recs) ranges.push_back({r->address, r->address + r->bytes});
  t.bytes += footprint(ranges, nullptr).bytes;
}

// Global memory: sectors touched against ceil(distinct bytes / 32).
void count_global(const std::vector<const Rec*>& recs, bool write, Totals& t) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const Rec* r : recs) ranges.push_back({r->address, r->address + r->bytes});
  State& s = state();
  const Footprint f = footprint(ranges, write ? &s.written_sectors : &s.read_sectors);
  t.bytes += f.bytes;
  t.sectors += f.sectors;
  t.ideal_sectors += (f.bytes + static_cast<int64_t>(kSector) - 1) / static_cast<int64_t>(kSector);
}

// The requests of one instruction and warp: the n-th execution of each lane make one.
void count_requests(const PendingKey& key, Pending& p) {
  State& s = state();
  std::stable_sort(p.recs.begin(), p.recs.end(),
                   [](const Rec& a, const Rec& b) { return a.occurrence < b.occurrence; });
  std::vector<const Rec*> shared, global;
  for (size_t i = 0; i < p.recs.size();) {
    size_t j = i;
    shared.clear();
    global.clear();
    for (; j < p.recs.size() && p.recs[j].occurrence == p.recs[i].occurrence; ++j)
      (p.recs[j].space == Space::Shared ? shared : global).push_back(&p.recs[j]);
    for (Space space : {Space::Shared, Space::Global}) {
      const std::vector<const Rec*>& recs = space == Space::Shared ? shared : global;
      if (recs.empty()) continue;
      Totals& t = s.totals[SiteKey{s.kernel, key.site, space, key.write}];
      ++t.requests;
      for (const Rec* r : recs) t.vector = t.vector && r->vector;
      if (space == Space::Shared)
        count_shared(recs, t);
      else
        count_global(recs, key.write, t);
    }
    i = j;
  }
}

// ---- Symbolisation: instruction addresses to file:line, through llvm-symbolizer -----------------
struct Module {
  std::string path;
  uintptr_t bias = 0;
};
Module module_of(const void* pc) {
  struct Search {
    uintptr_t pc;
    Module found;
  } search{reinterpret_cast<uintptr_t>(pc), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && s->pc >= lo && s->pc < lo + ph.p_memsz) {
            s->found = {info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "", info->dlpi_addr};
            return 1;
          }
        }
        return 0;
      },
      &search);
  if (search.found.path.empty()) {  // the executable itself: its path, for another process to open
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) search.found.path.assign(exe, static_cast<size_t>(n));
  }
  return search.found;
}

// A source path as the repository spells it.
std::string repo_path(std::string file) {
  for (const char* room : {"/kernels/", "/tests/"}) {
    const size_t at = file.rfind(room);
    if (at != std::string::npos) return file.substr(at + 1);
  }
  return file;
}

struct Location {
  std::string outer, inner;
};
// Every site's frames: the outermost inlined frame (the function the instruction belongs to)
// and the innermost (the access itself) when it differs. The return address minus one is
// inside the call or access instruction.
std::map<const void*, Location> symbolise(const std::set<const void*>& pcs) {
  std::map<const void*, Location> out;
  std::map<std::string, std::vector<std::pair<const void*, uintptr_t>>> by_module;
  for (const void* pc : pcs) {
    const Module m = module_of(pc);
    char raw[64];
    std::snprintf(raw, sizeof raw, "+%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(pc) - m.bias));
    out[pc].outer = (m.path.empty() ? std::string("?") : m.path.substr(m.path.rfind('/') + 1)) + raw;
    if (!m.path.empty()) by_module[m.path].push_back({pc, reinterpret_cast<uintptr_t>(pc) - m.bias - 1});
  }
  const char* tool = std::getenv("BELAY_EMU_SYMBOLIZER");
  const std::string symbolizer = tool && *tool ? tool : "llvm-symbolizer";
  for (const auto& entry : by_module) {
    const std::string& path = entry.first;
    const auto& list = entry.second;
    std::string cmd = symbolizer + " --inlining --functions=none --obj='" + path + "'";
    for (const auto& [pc, offset] : list) {
      char a[32];
      std::snprintf(a, sizeof a, " %#llx", static_cast<unsigned long long>(offset));
      cmd += a;
    }
    cmd += " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) continue;
    // One block of "file:line:column" lines per address (innermost frame first), then a blank line.
    std::vector<std::string> frames;
    size_t index = 0;
    char line[4096];
    auto flush = [&] {
      if (!frames.empty() && index < list.size() && frames.back().rfind("??", 0) != 0) {
        auto strip_column = [](std::string s) {
          const size_t c = s.rfind(':');
          return c != std::string::npos && s.find(':') != c ? s.substr(0, c) : s;
        };
        // The outermost frame of the kernel sources: a kernel inlined into the emulator's
        // launch body (simt.h) or a std:: helper is named by its own line.
        auto kernel_source = [](const std::string& f) {
          return (f.rfind("kernels/", 0) == 0 || f.rfind("tests/", 0) == 0) && f.rfind("kernels/cuda/emulation/", 0) != 0;
        };
        std::string outer = repo_path(strip_column(frames.back()));
        for (auto f = frames.rbegin(); f != frames.rend(); ++f) {
          const std::string path = repo_path(strip_column(*f));
          if (kernel_source(path)) {
            outer = path;
            break;
          }
        }
        Location& loc = out[list[index].first];
        loc.outer = outer;
        const std::string inner = repo_path(strip_column(frames.front()));
        loc.inner = inner != loc.outer ? inner : "";
      }
      if (!frames.empty()) ++index;
      frames.clear();
    };
    while (std::fgets(line, sizeof line, f)) {
      std::string s(line);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      if (s.empty())
        flush();
      else
        frames.push_back(s);
    }
    flush();
    pclose(f);
  }
  return out;
}

State::~State() {
  const char* path = std::getenv("BELAY_EMU_METRICS");
  if (!path || !*path || totals.empty()) return;
  const std::string text = table();
  // One append of the whole table: test processes running side by side never interleave.
  if (FILE* f = std::fopen(path, "a")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

}  // namespace

void set_enabled(bool on) { g_on = on; }

void reset() {
  State& s = state();
  s.pending.clear();
  s.totals.clear();
  s.read_sectors.clear();
  s.written_sectors.clear();
  s.mma = 0;
  s.launches.clear();
}

void begin_launch(const std::string& kernel, int threads_per_block) {
  State& s = state();
  s.kernel = kernel;
  s.pending.clear();
  s.read_sectors.clear();
  s.written_sectors.clear();
  s.mma = 0;
  s.covers.assign(static_cast<size_t>(threads_per_block), Cover{});
}

void end_block() {
  State& s = state();
  for (auto& [key, p] : s.pending) count_requests(key, p);
  s.pending.clear();
  std::fill(s.covers.begin(), s.covers.end(), Cover{});
}

void end_launch() {
  State& s = state();
  end_block();
  s.launches.push_back({s.kernel, static_cast<int64_t>(s.read_sectors.size()),
                        static_cast<int64_t>(s.written_sectors.size()), s.mma});
}

void access(const void* site, int warp, int lane, Space space, bool write, uint64_t address, uint32_t bytes,
            bool vector) {
  if (bytes == 0) return;
  Pending& p = state().pending[PendingKey{site, warp, write}];
  p.recs.push_back({p.occurrences[lane]++, static_cast<uint8_t>(lane), space, vector, bytes, address});
}

void mma(int count) { state().mma += count; }

void cover_vector(int thread, const void* p, uint32_t bytes) {
  State& s = state();
  if (thread < 0 || static_cast<size_t>(thread) >= s.covers.size()) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  s.covers[static_cast<size_t>(thread)] = {a, a + bytes, bytes};
}

bool covered_by_vector(int thread, const void* p, uint32_t bytes) {
  State& s = state();
  if (thread < 0 || static_cast<size_t>(thread) >= s.covers.size()) return false;
  Cover& c = s.covers[static_cast<size_t>(thread)];
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (c.budget < bytes || a < c.lo || a + bytes > c.hi) return false;
  c.budget -= bytes;
  return true;
}

double SiteStats::efficiency() const {
  if (space == Space::Shared) return wavefronts > 0 ? static_cast<double>(ideal_wavefronts) / wavefronts : 1.0;
  return sectors > 0 ? static_cast<double>(ideal_sectors) / sectors : 1.0;
}

std::vector<SiteStats> sites() {
  State& s = state();
  std::set<const void*> pcs;
  for (const auto& [key, t] : s.totals) pcs.insert(std::get<1>(key));
  const std::map<const void*, Location> where = symbolise(pcs);
  // Instructions of one source line (an unrolled loop's copies) make one site.
  std::map<std::tuple<std::string, std::string, std::string, Space, bool>, SiteStats> merged;
  for (const auto& [key, t] : s.totals) {
    const auto& [kernel, pc, space, write] = key;
    const Location& loc = where.at(pc);
    SiteStats& m = merged[{kernel, loc.outer, loc.inner, space, write}];
    if (m.requests == 0) {
      m.kernel = kernel;
      m.location = loc.outer;
      m.inlined = loc.inner;
      m.space = space;
      m.write = write;
      m.vector = true;
    }
    m.vector = m.vector && t.vector;
    m.requests += t.requests;
    m.bytes += t.bytes;
    m.wavefronts += t.wavefronts;
    m.ideal_wavefronts += t.ideal_wavefronts;
    m.sectors += t.sectors;
    m.ideal_sectors += t.ideal_sectors;
  }
  std::vector<SiteStats> out;
  for (auto& [key, m] : merged) out.push_back(std::move(m));
  return out;
}

std::vector<LaunchStats> launches() { return state().launches; }

std::string table() {
  std::string text =
      "# belay emulated kernel memory metrics (kernels/cuda/emulation/memory_metrics.h): per kernel and access site,\n"
      "# shared: wavefronts/ideal (every extra wavefront is a bank conflict); global: 32-byte sectors/ideal.\n";
  char line[768];
  std::snprintf(line, sizeof line, "%-28s %-44s %-6s %-5s %9s %19s %19s %6s  %s\n", "kernel", "site", "space", "op",
                "requests", "wavefronts/ideal", "sectors/ideal", "eff", "innermost frame");
  text += line;
  for (const SiteStats& s : sites()) {
    const bool shared = s.space == Space::Shared;
    const std::string w = shared ? std::to_string(s.wavefronts) + "/" + std::to_string(s.ideal_wavefronts) : "-";
    const std::string g = shared ? "-" : std::to_string(s.sectors) + "/" + std::to_string(s.ideal_sectors);
    std::snprintf(line, sizeof line, "%-28s %-44s %-6s %-5s %9lld %19s %19s %5.1f%%  %s\n", s.kernel.c_str(),
                  s.location.c_str(), shared ? "shared" : "global",
                  (std::string(s.write ? "st" : "ld") + (s.vector ? ".v" : "")).c_str(),
                  static_cast<long long>(s.requests), w.c_str(), g.c_str(), 100.0 * s.efficiency(),
                  s.inlined.c_str());
    text += line;
  }
  return text;
}

}  // namespace belay::emu::metrics
