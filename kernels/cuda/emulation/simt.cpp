// The SIMT scheduler: each CUDA thread of a block is a fiber with its own stack that runs
// until it reaches a barrier, a warp collective or its end; then the scheduler picks the
// next. Between two barriers the runnable threads go in an order drawn from the seed, and
// the blocks of a grid too, so code that leans on an unspoken order (thread 0 first, block
// 0 first) gets a chance to fail. The shared-memory race check watches every load and store
// the kernels make (clang's -fsanitize-coverage=trace-loads,trace-stores calls the hooks at
// the end of this file) and the twins' own accesses: within one barrier interval, a byte
// written by one thread and read or written by another is a race, reported with the
// kernel, the block, both threads and the offset.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "engine/whole_lines.h"
#include "kernels/cuda/emulation/memory_metrics.h"
#include "kernels/cuda/emulation/simt_internal.h"
#include "kernels/cuda/emulation/warp_matrix.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BELAY_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define BELAY_EMU_ASAN 1
#endif
#if BELAY_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The hot path of the emulator (every load and store of a kernel): not instrumented itself.
#define BELAY_EMU_HOT __attribute__((no_sanitize("address", "undefined")))

#if !defined(__x86_64__)
#error "the SIMT emulator's fiber switch is written for x86-64"
#endif

// Saves the callee-saved registers on the current stack, stores the stack pointer in
// *save, switches to `next` and restores what is saved there. A new fiber's stack is laid
// out by start_fiber so that the first switch "returns" into fiber_entry.
extern "C" void belay_emu_switch(void** save, void* next);
asm(R"(
  .text
  .globl belay_emu_switch
  .type belay_emu_switch, @function
belay_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size belay_emu_switch, .-belay_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace belay::emu {
namespace {

constexpr size_t kStackBytes = size_t{256} << 10;  // ASan's redzones make frames large
constexpr int kWarpSize = 32;

// ---- Per-thread state ----------------------------------------------------------------------
enum class Wait { Runnable, Barrier, Warp, Exited };
enum class Collective { None, Generic, Ldmatrix, Mma };

struct AsyncCopy {
  uint32_t dst;
  const void* src;
  int src_bytes;
};

struct WarpRequest {
  Collective kind = Collective::None;
  // generic
  WarpOp op = WarpOp::Shfl;
  unsigned mask = 0;
  uint64_t value = 0;
  int param = 0;
  int width = kWarpSize;
  uint64_t result = 0;
  // ldmatrix
  uint32_t addr = 0;
  bool trans = false;
  uint32_t* regs_out = nullptr;
  const void* site = nullptr;  // the instruction, for the memory metrics
  // mma
  const uint32_t* a = nullptr;
  const uint32_t* b = nullptr;
  float* d = nullptr;
  bool bf16 = false;
};

struct Thread {
  ThreadCoords c{};
  int linear = 0, warp = 0, lane = 0;
  void* sp = nullptr;
  char* stack = nullptr;  // lowest usable byte
  Wait wait = Wait::Runnable;
  WarpRequest req;
  std::vector<AsyncCopy> uncommitted;
  std::deque<std::vector<AsyncCopy>> groups;
  void* fake_stack = nullptr;
};

// One shadow entry per shared byte and kind of access: the barrier interval, the thread
// (linear id + 1; kMany for several readers) and its warp's collective count at the time.
struct Shadow {
  uint32_t interval = 0;
  uint16_t tid1 = 0;
  uint16_t warp_epoch = 0;
};
constexpr uint16_t kMany = 0xffff;

struct SharedRegion {
  const void* site = nullptr;  // nullptr: the dynamic region
  char* host = nullptr;
  size_t bytes = 0;
  uint32_t window = 0;  // its shared-window address
  int index = 0;        // declaration order, for reports
  Shadow* writes = nullptr;  // bytes entries each, from the shadow pool
  Shadow* reads = nullptr;
};

// Shadows are kept per declaration (and size) from block to block and launch to launch:
// barrier intervals are numbered across all of them, so an entry left by an earlier block
// is simply from another interval and needs no clearing.
struct ShadowPair {
  std::vector<Shadow> writes, reads;
};

struct Block {
  GridLaunch* launch = nullptr;
  uint3 idx{};
  std::vector<Thread> threads;  // reused from block to block: resized, each thread reset
  std::vector<SharedRegion> regions;
  uint32_t next_window = 0;
  uint32_t interval = 0;
  std::vector<uint16_t> warp_epoch;
  std::string fault;  // the first fault, "" if none
  cudaError_t fault_error = cudaSuccess;  // the first fault's CUDA error
  int faults = 0;
};

// ---- Scheduler state (one kernel runs at a time: the stream queue is in order) --------------
Thread* g_thread = nullptr;  // the fiber running now; null on the scheduler's own stack
Block* g_block = nullptr;
// The span of the running block's shared allocations: most accesses the hooks see are to
// registers spilled on the fiber's stack or to global memory, and leave at this test.
uintptr_t g_shared_lo = 0, g_shared_hi = 0;
uint32_t g_intervals = 0;  // barrier intervals numbered across every block and launch
std::map<std::pair<const void*, size_t>, ShadowPair> g_shadows;
void* g_sched_sp = nullptr;
// The fibers' stacks, reused from block to block. `dirty`: the lowest address a fiber on the
// stack was switched out at since the stack was last cleaned. In ASan builds a fiber's frames
// that are live when it switches out (or is abandoned at a fault, or exits) keep their
// redzones' poison; every one of them lies at or above the stack pointer it switched out with,
// and deeper frames unpoisoned themselves when they returned. So cleaning the stack for the
// next fiber unpoisons [dirty, top): a few KiB, not all 256 KiB (32 KiB of shadow per thread,
// 8 MiB per block of 256 threads; cleaning it all was 27% of the sanitizer build's tensor-core
// GEMM test and 44% of its cross-entropy test).
struct FiberStack {
  char* lowest;
  char* dirty;
};
std::vector<FiberStack> g_stacks;
std::mt19937_64 g_rng;
bool g_rng_seeded = false;
int g_faults_reported = 0;
#if BELAY_EMU_ASAN
void* g_sched_fake_stack = nullptr;
const void* g_main_stack_bottom = nullptr;
size_t g_main_stack_size = 0;
#endif

[[noreturn]] void die(const std::string& what) {
  write_all(2, "belay-emu: " + what + "\n");
  std::abort();
}

std::string dim_text(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

std::string thread_text(const Thread& t) { return "thread " + dim_text(t.c.thread_idx); }

// A fault inside a kernel: the launch fails (runtime.cpp makes `error` sticky, as a fault on
// a GPU is) and the first report is printed.
void fault(const std::string& what, cudaError_t error = cudaErrorLaunchFailure) {
  Block* b = g_block;
  if (!b) die(what);
  ++b->faults;
  if (b->fault.empty()) {
    b->fault = "in " + b->launch->name + " block " + dim_text(b->idx) + ": " + what;
    b->fault_error = error;
    write_all(2, "belay-emu: " + b->fault + "\n");
    std::fflush(stderr);
  }
}

FiberStack& stack_for(size_t i) {
  while (g_stacks.size() <= i) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) die("cannot map a fiber stack");
    mprotect(p, page, PROT_NONE);  // a guard page: a stack overflow faults instead of corrupting
    char* lowest = static_cast<char*>(p) + page;
    g_stacks.push_back(FiberStack{lowest, lowest + kStackBytes});
  }
  return g_stacks[i];
}

// ---- Fibers -----------------------------------------------------------------------------------
void finish_copies(Thread& t);

void switch_to_scheduler(Thread& t, bool exiting) {
#if BELAY_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t.fake_stack, g_main_stack_bottom, g_main_stack_size);
#else
  (void)exiting;
#endif
  belay_emu_switch(&t.sp, g_sched_sp);
#if BELAY_EMU_ASAN
  __sanitizer_finish_switch_fiber(t.fake_stack, nullptr, nullptr);
#endif
}

void fiber_entry() {
#if BELAY_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_main_stack_bottom, &g_main_stack_size);
#endif
  Thread& t = *g_thread;
  g_block->launch->body->run_thread();
  finish_copies(t);
  t.wait = Wait::Exited;
  switch_to_scheduler(t, true);
  die("an exited fiber was resumed");
}

void start_fiber(Thread& t, FiberStack& s) {
  char* const top = s.lowest + kStackBytes;
#if BELAY_EMU_ASAN
  __asan_unpoison_memory_region(s.dirty, static_cast<size_t>(top - s.dirty));  // the last fiber's live frames
#endif
  s.dirty = top;
  t.stack = s.lowest;
  auto* words = reinterpret_cast<uintptr_t*>(top);
  words[-1] = 0;                                           // alignment: entry sees rsp % 16 == 8
  words[-2] = reinterpret_cast<uintptr_t>(&fiber_entry);   // where belay_emu_switch returns to
  for (int i = 3; i <= 8; ++i) words[-i] = 0;              // rbp rbx r12 r13 r14 r15
  t.sp = words - 8;
}

void resume(Thread& t) {
  g_thread = &t;
#if BELAY_EMU_ASAN
  __sanitizer_start_switch_fiber(&g_sched_fake_stack, t.stack, kStackBytes);
#endif
  belay_emu_switch(&g_sched_sp, t.sp);
#if BELAY_EMU_ASAN
  __sanitizer_finish_switch_fiber(g_sched_fake_stack, nullptr, nullptr);
#endif
  g_thread = nullptr;
  FiberStack& s = g_stacks[static_cast<size_t>(t.linear)];
  s.dirty = std::min(s.dirty, static_cast<char*>(t.sp));  // where it switched out: its live frames lie above
}

Thread& current(const char* what) {
  if (!g_thread) die(std::string(what) + " called outside an emulated kernel");
  return *g_thread;
}

// ---- Shared memory and the race check -----------------------------------------------------------
BELAY_EMU_HOT SharedRegion* region_of(const void* p) {
  for (SharedRegion& r : g_block->regions)
    if (p >= r.host && p < r.host + r.bytes) return &r;
  return nullptr;
}

SharedRegion* region_of_window(uint32_t addr) {
  for (SharedRegion& r : g_block->regions)
    if (addr >= r.window && addr < r.window + r.bytes) return &r;
  return nullptr;
}

SharedRegion& add_region(const void* site, size_t bytes, size_t align) {
  Block& b = *g_block;
  SharedRegion r;
  r.site = site;
  r.bytes = bytes;
  r.index = static_cast<int>(b.regions.size());
  // Exactly `bytes`: AddressSanitizer reports the first byte past it.
  void* host = nullptr;
  if (posix_memalign(&host, align < 16 ? 16 : align, bytes == 0 ? 1 : bytes) != 0) die("out of host memory");
  r.host = static_cast<char*>(host);
  std::memset(r.host, 0xff, bytes);  // what the last block left: NaN in every float format
  b.next_window = static_cast<uint32_t>((b.next_window + align - 1) / align * align);
  r.window = b.next_window;
  b.next_window += static_cast<uint32_t>(bytes);
  ShadowPair& shadow = g_shadows[{site, bytes}];
  if (shadow.writes.size() != bytes) {
    shadow.writes.assign(bytes, Shadow{});
    shadow.reads.assign(bytes, Shadow{});
  }
  r.writes = shadow.writes.data();
  r.reads = shadow.reads.data();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(r.host), hi = lo + bytes;
  if (b.regions.empty() || lo < g_shared_lo) g_shared_lo = lo;
  if (b.regions.empty() || hi > g_shared_hi) g_shared_hi = hi;
  b.regions.push_back(std::move(r));
  return b.regions.back();
}

std::string region_text(const SharedRegion& r, size_t offset) {
  return "byte " + std::to_string(offset) + " of " +
         (r.site ? "static shared declaration #" + std::to_string(r.index) : std::string("dynamic shared memory")) +
         " (" + std::to_string(r.bytes) + " bytes)";
}

// Whether an earlier access is ordered before thread t's access now: a barrier between them,
// the same thread, or the same warp with a warp collective (or __syncwarp) between them.
BELAY_EMU_HOT bool ordered(const Shadow& s, const Thread& t) {
  if (s.interval != g_block->interval || s.tid1 == 0) return true;
  if (s.tid1 == t.linear + 1) return true;
  if (s.tid1 != kMany && (s.tid1 - 1) / kWarpSize == t.warp && g_block->warp_epoch[t.warp] != s.warp_epoch)
    return true;
  return false;
}

const Thread* thread_by_tid1(uint16_t tid1) {
  if (tid1 == 0 || tid1 == kMany) return nullptr;
  return &g_block->threads[tid1 - 1];
}

void race(const Thread& t, bool write, const SharedRegion& r, size_t offset, const Shadow& other, bool other_write) {
  const Thread* o = thread_by_tid1(other.tid1);
  fault(std::string("shared-memory race: ") + thread_text(t) + (write ? " writes " : " reads ") +
        region_text(r, offset) + " that " + (o ? thread_text(*o) : std::string("other threads")) +
        (other_write ? " wrote" : " read") + " in the same barrier interval");
}

BELAY_EMU_HOT void record(const Thread& t, SharedRegion& r, size_t offset, size_t size, bool write) {
  const Shadow now{g_block->interval, static_cast<uint16_t>(t.linear + 1), g_block->warp_epoch[t.warp]};
  const size_t end = std::min(offset + size, r.bytes);
  for (size_t i = offset; i < end; ++i) {
    Shadow& w = r.writes[i];
    Shadow& rd = r.reads[i];
    if (!ordered(w, t)) {
      race(t, write, r, i, w, true);
      return;
    }
    if (write) {
      if (rd.interval == g_block->interval && rd.tid1 != 0 &&
          (rd.tid1 == kMany || !ordered(rd, t))) {
        race(t, true, r, i, rd, false);
        return;
      }
      w = now;
      rd = Shadow{};
    } else if (rd.interval != g_block->interval || rd.tid1 == 0 || rd.tid1 == now.tid1) {
      rd = now;
    } else if (rd.tid1 != kMany && !ordered(rd, t)) {
      rd.tid1 = kMany;  // a second reader: still fine, but a later writer races with one of them
    } else if (rd.tid1 != kMany) {
      rd = now;  // the earlier read is ordered before this one (same warp, synchronised)
    }
  }
}

BELAY_EMU_HOT inline void on_access(const void* p, size_t size, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a >= g_shared_hi || a < g_shared_lo) return;  // not shared memory (or no kernel running)
  Thread* t = g_thread;
  if (!t) return;  // host code of the kernel files (the launchers)
  SharedRegion* r = region_of(p);
  if (!r) return;  // global memory: AddressSanitizer checks its bounds
  record(*t, *r, static_cast<size_t>(static_cast<const char*>(p) - r->host), size, write);
}

// ---- Memory metrics (memory_metrics.h): which memory an access is, for the per-site counts -----
uintptr_t g_device_lo = 0, g_device_hi = 0;  // the last allocation found: most accesses hit it again

BELAY_EMU_HOT bool is_device_memory(uintptr_t a) {
  if (a >= g_device_lo && a < g_device_hi) return true;
  return device_allocation(reinterpret_cast<const void*>(a), &g_device_lo, &g_device_hi);
}

// One lane's access at `site` (an instruction of the kernel code): shared memory by its
// window address, global memory (a cudaMalloc allocation) by its address; the fiber's stack
// (registers the host compiler spilled) and anything else is not counted.
BELAY_EMU_HOT void count_access(const void* p, size_t size, bool write, const void* site, bool vector = false) {
  Thread* t = g_thread;
  if (!t) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a >= reinterpret_cast<uintptr_t>(t->stack) && a < reinterpret_cast<uintptr_t>(t->stack) + kStackBytes) return;
  if (metrics::covered_by_vector(t->linear, p, static_cast<uint32_t>(size))) return;
  if (a >= g_shared_lo && a < g_shared_hi) {
    if (SharedRegion* r = region_of(p)) {
      metrics::access(site, t->warp, t->lane, metrics::Space::Shared, write,
                      r->window + (a - reinterpret_cast<uintptr_t>(r->host)), static_cast<uint32_t>(size), vector);
      return;
    }
  }
  if (is_device_memory(a))
    metrics::access(site, t->warp, t->lane, metrics::Space::Global, write, a, static_cast<uint32_t>(size), vector);
}

// A vector access named in the source (load_vector/store_vector): counted whole at its site;
// the hooked loads or stores clang turns it into are then not counted again.
void count_vector(const void* p, size_t width, bool write, const void* site) {
  Thread* t = g_thread;
  count_access(p, width, write, site, true);
  metrics::cover_vector(t->linear, p, static_cast<uint32_t>(width));
}

// A shared-window range [addr, addr + bytes) as a host pointer; a range that is not inside
// one region is an out-of-bounds shared access (a fault on a GPU too).
char* window_to_host(const Thread& t, uint32_t addr, size_t bytes, const char* what) {
  SharedRegion* r = region_of_window(addr);
  if (!r || addr + bytes > r->window + r->bytes) {
    fault(std::string(what) + ": " + thread_text(t) + " addresses shared bytes [" + std::to_string(addr) + ", " +
          std::to_string(addr + bytes) + "), outside every shared allocation of the block");
    return nullptr;
  }
  return r->host + (addr - r->window);
}

// ---- Misaligned vector accesses and cp.async ------------------------------------------------------
// x86 forgives a vector access at an address not aligned to its width; the GPU faults, with
// cudaErrorMisalignedAddress (the grid stops, the context is lost).
void misaligned(const Thread& t, const char* what, bool write, uintptr_t address, size_t width) {
  char where[32];
  std::snprintf(where, sizeof where, "%#llx", static_cast<unsigned long long>(address));
  fault(std::string("misaligned address: ") + what + thread_text(t) + (write ? " stores " : " loads ") +
            std::to_string(width) + " bytes at " + where + ", not " + std::to_string(width) + "-byte aligned",
        cudaErrorMisalignedAddress);
}

void complete_copy(Thread& t, const AsyncCopy& c) {
  char* dst = window_to_host(t, c.dst, 16, "cp.async");
  if (!dst) return;
  SharedRegion* r = region_of(dst);
  record(t, *r, static_cast<size_t>(dst - r->host), 16, true);
  const int n = c.src_bytes < 0 ? 0 : (c.src_bytes > 16 ? 16 : c.src_bytes);
#if BELAY_EMU_ASAN
  if (n > 0 && __asan_region_is_poisoned(const_cast<void*>(c.src), static_cast<size_t>(n))) {
    fault("cp.async: " + thread_text(t) + " copies " + std::to_string(n) +
          " bytes from global memory outside any allocation");
    return;
  }
#endif
  if (n > 0) std::memcpy(dst, c.src, static_cast<size_t>(n));
  std::memset(dst + n, 0, static_cast<size_t>(16 - n));  // src-size < 16: the rest is zero-filled
}

void finish_copies(Thread& t) {
  if (!t.uncommitted.empty()) t.groups.push_back(std::move(t.uncommitted));
  t.uncommitted.clear();
  for (const auto& g : t.groups)
    for (const AsyncCopy& c : g) complete_copy(t, c);
  t.groups.clear();
}

// ---- Warp collectives (run by the scheduler once every lane has arrived) --------------------------
unsigned warp_lanes(const Block& b, int warp) {
  const int n = static_cast<int>(b.threads.size()) - warp * kWarpSize;
  return n >= kWarpSize ? 0xffffffffu : ((1u << n) - 1u);
}

uint64_t generic_result(Block& b, int warp, const Thread& t) {
  const WarpRequest& q = t.req;
  auto value_of = [&](int lane) { return b.threads[warp * kWarpSize + lane].req.value; };
  const int width = q.width <= 0 || q.width > kWarpSize ? kWarpSize : q.width;
  const int base = (t.lane / width) * width;
  switch (q.op) {
    case WarpOp::Shfl: return value_of(base + ((q.param % width) + width) % width);
    case WarpOp::ShflUp: return t.lane - base >= q.param ? value_of(t.lane - q.param) : q.value;
    case WarpOp::ShflDown: return t.lane - base + q.param < width ? value_of(t.lane + q.param) : q.value;
    case WarpOp::ShflXor: {
      const int src = t.lane ^ q.param;
      return src >= base && src < base + width ? value_of(src) : q.value;
    }
    case WarpOp::Ballot:
    case WarpOp::Any:
    case WarpOp::All: {
      uint64_t ballot = 0;
      for (int l = 0; l < kWarpSize; ++l)
        if ((q.mask >> l) & 1u) ballot |= (value_of(l) != 0 ? 1ull : 0ull) << l;
      if (q.op == WarpOp::Ballot) return ballot;
      if (q.op == WarpOp::Any) return ballot != 0;
      return ballot == (q.mask & warp_lanes(b, warp));
    }
  }
  return 0;
}

void run_ldmatrix(Block& b, int warp) {
  const uint16_t* rows[32];
  static const uint16_t zeros[8] = {};
  for (int l = 0; l < kWarpSize; ++l) {
    Thread& t = b.threads[warp * kWarpSize + l];
    const char* p = (t.req.addr % 16 == 0) ? window_to_host(t, t.req.addr, 16, "ldmatrix") : nullptr;
    if (t.req.addr % 16 != 0)
      fault("ldmatrix: " + thread_text(t) + " gives a row address not 16-byte aligned (" + std::to_string(t.req.addr) +
            ")");
    if (p) {
      SharedRegion* r = region_of(p);
      record(t, *r, static_cast<size_t>(p - r->host), 16, false);
    }
    rows[l] = p ? reinterpret_cast<const uint16_t*>(p) : zeros;
    // One row of 16 bytes per lane; the hardware reads the 8 rows of each matrix in one phase.
    if (metrics::enabled()) metrics::access(t.req.site, warp, l, metrics::Space::Shared, false, t.req.addr, 16, true);
  }
  uint32_t out[32][4];
  ldmatrix_x4_fragments(rows, b.threads[warp * kWarpSize].req.trans, out);
  for (int l = 0; l < kWarpSize; ++l) std::memcpy(b.threads[warp * kWarpSize + l].req.regs_out, out[l], 16);
}

void run_mma(Block& b, int warp) {
  uint32_t a[32][4], bb[32][2];
  float d[32][4];
  for (int l = 0; l < kWarpSize; ++l) {
    const WarpRequest& q = b.threads[warp * kWarpSize + l].req;
    std::memcpy(a[l], q.a, 16);
    std::memcpy(bb[l], q.b, 8);
    std::memcpy(d[l], q.d, 16);
  }
  mma_m16n8k16_fragments(a, bb, b.threads[warp * kWarpSize].req.bf16, d);
  if (metrics::enabled()) metrics::mma(1);
  for (int l = 0; l < kWarpSize; ++l) std::memcpy(b.threads[warp * kWarpSize + l].req.d, d[l], 16);
}

const char* collective_name(const WarpRequest& q) {
  switch (q.kind) {
    case Collective::Ldmatrix: return q.trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    case Collective::Mma: return q.bf16 ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16";
    default: break;
  }
  switch (q.op) {
    case WarpOp::Shfl: return "__shfl_sync";
    case WarpOp::ShflUp: return "__shfl_up_sync";
    case WarpOp::ShflDown: return "__shfl_down_sync";
    case WarpOp::ShflXor: return "__shfl_xor_sync";
    case WarpOp::Ballot: return "__ballot_sync/__syncwarp";
    case WarpOp::Any: return "__any_sync";
    case WarpOp::All: return "__all_sync";
  }
  return "?";
}

bool same_collective(const WarpRequest& x, const WarpRequest& y) {
  if (x.kind != y.kind) return false;
  if (x.kind == Collective::Generic) return x.op == y.op && x.mask == y.mask;
  if (x.kind == Collective::Ldmatrix) return x.trans == y.trans;
  return x.bf16 == y.bf16;
}

// Completes the collective of one warp if every lane it needs has arrived. Returns whether
// it did (or found a fault that ends the block).
bool try_collective(Block& b, int warp) {
  const unsigned lanes = warp_lanes(b, warp);
  const Thread* first = nullptr;
  for (int l = 0; l < kWarpSize; ++l)
    if ((lanes >> l) & 1u) {
      const Thread& t = b.threads[warp * kWarpSize + l];
      if (t.wait == Wait::Warp) {
        first = &t;
        break;
      }
    }
  if (!first) return false;
  // ldmatrix and mma are .aligned: the whole warp executes them; a shuffle needs its mask.
  const unsigned need = first->req.kind == Collective::Generic ? (first->req.mask & lanes) : lanes;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!((need >> l) & 1u)) continue;
    const Thread& t = b.threads[warp * kWarpSize + l];
    if (t.wait == Wait::Runnable) return false;  // not there yet
    if (t.wait == Wait::Exited || t.wait == Wait::Barrier || !same_collective(t.req, first->req)) {
      fault(std::string("divergent warp collective: ") + thread_text(*first) + " waits at " +
            collective_name(first->req) + " while lane " + std::to_string(l) + " " +
            (t.wait == Wait::Exited    ? "has exited"
             : t.wait == Wait::Barrier ? "waits at __syncthreads"
                                       : std::string("waits at ") + collective_name(t.req)));
      return true;
    }
  }
  switch (first->req.kind) {
    case Collective::Ldmatrix: run_ldmatrix(b, warp); break;
    case Collective::Mma: run_mma(b, warp); break;
    default:
      for (int l = 0; l < kWarpSize; ++l)
        if ((need >> l) & 1u) {
          Thread& t = b.threads[warp * kWarpSize + l];
          t.req.result = generic_result(b, warp, t);
        }
      break;
  }
  ++b.warp_epoch[warp];  // what each lane did before is ordered before what it does after
  for (int l = 0; l < kWarpSize; ++l)
    if ((need >> l) & 1u) {
      Thread& t = b.threads[warp * kWarpSize + l];
      t.wait = Wait::Runnable;
      t.req.kind = Collective::None;
    }
  return true;
}

// Suspends the calling thread at a warp collective until the scheduler completes it.
void wait_warp(Thread& t) {
  t.wait = Wait::Warp;
  switch_to_scheduler(t, false);
}

// ---- Blocks ---------------------------------------------------------------------------------------
// Every thread of the block at the start of the kernel, each on its fiber's stack; returns how
// many there are.
int start_threads(Block& b) {
  const dim3 bd = b.launch->block;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  b.threads.resize(static_cast<size_t>(n));
  b.warp_epoch.assign(static_cast<size_t>((n + kWarpSize - 1) / kWarpSize), 0);
  b.interval = ++g_intervals;
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[static_cast<size_t>(i)];
    t.wait = Wait::Runnable;
    t.req = WarpRequest{};
    t.uncommitted.clear();
    t.groups.clear();
    t.fake_stack = nullptr;
    t.linear = i;
    t.warp = i / kWarpSize;
    t.lane = i % kWarpSize;
    t.c.thread_idx = uint3{static_cast<unsigned>(i) % bd.x, (static_cast<unsigned>(i) / bd.x) % bd.y,
                           static_cast<unsigned>(i) / (bd.x * bd.y)};
    t.c.block_idx = b.idx;
    t.c.block_dim = bd;
    t.c.grid_dim = b.launch->grid;
    start_fiber(t, stack_for(static_cast<size_t>(i)));
  }
  return n;
}

void run_block(Block& b) {
  const int n = start_threads(b);
  // The runnable threads of a round, in the seed's order. Filled by index, not push_back:
  // this loop runs once per round of every block, and ASan checks each push_back.
  std::vector<int> order(static_cast<size_t>(n));
  for (;;) {
    size_t runnable = 0;
    for (int i = 0; i < n; ++i)
      if (b.threads[static_cast<size_t>(i)].wait == Wait::Runnable) order[runnable++] = i;
    if (runnable > 0) {
      std::shuffle(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(runnable), g_rng);
      for (size_t k = 0; k < runnable; ++k) {
        Thread& t = b.threads[static_cast<size_t>(order[k])];
        if (t.wait == Wait::Runnable) resume(t);
      }
      continue;
    }
    bool progress = false;
    for (size_t w = 0; w < b.warp_epoch.size(); ++w) progress |= try_collective(b, static_cast<int>(w));
    if (!b.fault.empty()) return;
    if (progress) continue;
    int exited = 0, at_barrier = 0, at_warp = 0;
    for (const Thread& t : b.threads) {
      exited += t.wait == Wait::Exited;
      at_barrier += t.wait == Wait::Barrier;
      at_warp += t.wait == Wait::Warp;
    }
    if (exited == n) return;
    if (at_barrier > 0 && at_warp == 0 && exited == 0) {
      b.interval = ++g_intervals;  // a new barrier interval: earlier accesses are ordered before later ones
      for (Thread& t : b.threads) t.wait = Wait::Runnable;
      continue;
    }
    if (at_barrier > 0 && exited > 0) {
      fault("divergent __syncthreads: " + std::to_string(at_barrier) + " threads wait at a barrier that " +
            std::to_string(exited) + " threads of the block left by exiting");
      return;
    }
    fault("deadlock: " + std::to_string(at_barrier) + " threads at __syncthreads, " + std::to_string(at_warp) +
          " at warp collectives that cannot complete");
    return;
  }
}

void free_regions(Block& b) {
  for (SharedRegion& r : b.regions) std::free(r.host);
  b.regions.clear();
  g_shared_lo = g_shared_hi = 0;
}

// ---- Coverage: how often each kernel ran, appended to $BELAY_EMU_COVERAGE at exit ----------------
struct Coverage {
  std::mutex mutex;
  std::map<std::string, long> launches;
  ~Coverage() {
    const char* path = std::getenv("BELAY_EMU_COVERAGE");
    if (!path || !*path || launches.empty()) return;
    std::string text;
    for (const auto& [name, count] : launches) text += name + "\t" + std::to_string(count) + "\n";
    // One append of the whole table: tests running side by side never interleave lines.
    if (FILE* f = std::fopen(path, "a")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
};
Coverage& coverage() {
  static Coverage c;
  return c;
}

}  // namespace

// ---- The kernel-facing API (simt.h) ---------------------------------------------------------------
const ThreadCoords& coords() { return current("threadIdx/blockIdx").c; }

void syncthreads() {
  Thread& t = current("__syncthreads");
  t.wait = Wait::Barrier;
  switch_to_scheduler(t, false);
}

void syncwarp(unsigned mask) { (void)warp_collective(WarpOp::Ballot, mask, 1, 0, kWarpSize); }

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width) {
  Thread& t = current("a warp collective");
  if (!((mask >> t.lane) & 1u)) fault(thread_text(t) + " calls a warp collective whose mask leaves it out");
  t.req = WarpRequest{};
  t.req.kind = Collective::Generic;
  t.req.op = op;
  t.req.mask = mask;
  t.req.value = value;
  t.req.param = param;
  t.req.width = width;
  wait_warp(t);
  return t.req.result;
}

void* block_shared(const void* site, size_t bytes, size_t align) {
  current("a __shared__ declaration");
  for (SharedRegion& r : g_block->regions)
    if (r.site == site) return r.host;
  return add_region(site, bytes, align).host;
}

void* dynamic_shared(size_t align) {
  current("extern __shared__");
  for (SharedRegion& r : g_block->regions)
    if (r.site == nullptr) return r.host;
  return add_region(nullptr, g_block->launch->smem, align).host;
}

uint32_t shared_address(const void* generic) {
  Thread& t = current("__cvta_generic_to_shared");
  SharedRegion* r = region_of(generic);
  if (!r) {
    // One past the end is a valid pointer to form; anything else is not shared memory.
    for (SharedRegion& s : g_block->regions)
      if (generic == s.host + s.bytes) return s.window + static_cast<uint32_t>(s.bytes);
    fault("__cvta_generic_to_shared: " + thread_text(t) + " converts a pointer that is not shared memory");
    return 0xffffffffu;
  }
  return r->window + static_cast<uint32_t>(static_cast<const char*>(generic) - r->host);
}

bool vector_access_aligned(const void* p, size_t width, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if ((a & (width - 1)) == 0) {
    if (metrics::enabled()) count_vector(p, width, write, __builtin_return_address(0));
    return true;
  }
  misaligned(current("a vector access"), "", write, a, width);
  return false;
}

void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  Thread& t = current("cp.async");
  // cp.async.cg ... 16: both addresses aligned to the copy's 16 bytes (PTX ISA, cp.async),
  // whatever src-size is. A misaligned one faults and copies nothing.
  const uintptr_t from = reinterpret_cast<uintptr_t>(src);
  if (dst % 16 != 0 || from % 16 != 0) {
    if (dst % 16 != 0)
      misaligned(t, "cp.async to shared memory: ", true, dst, 16);  // a shared-window address
    else
      misaligned(t, "cp.async from global memory: ", false, from, 16);
    return;
  }
  // The copy may land at any moment until its wait: a thread touching these bytes in this
  // barrier interval already races with it.
  if (char* p = window_to_host(t, dst, 16, "cp.async")) {
    SharedRegion* r = region_of(p);
    record(t, *r, static_cast<size_t>(p - r->host), 16, true);
    if (metrics::enabled()) {
      const void* site = __builtin_return_address(0);
      metrics::access(site, t.warp, t.lane, metrics::Space::Shared, true, dst, 16, true);
      if (src_bytes > 0 && is_device_memory(from))  // src-size 0 zero-fills: nothing is read
        metrics::access(site, t.warp, t.lane, metrics::Space::Global, false, from,
                        static_cast<uint32_t>(std::min(src_bytes, 16)), true);
    }
  }
  t.uncommitted.push_back({dst, src, src_bytes});
}

void cp_async_commit() {
  Thread& t = current("cp.async.commit_group");
  t.groups.push_back(std::move(t.uncommitted));
  t.uncommitted.clear();
}

void cp_async_wait(int pending) {
  Thread& t = current("cp.async.wait_group");
  while (static_cast<int>(t.groups.size()) > pending) {
    for (const AsyncCopy& c : t.groups.front()) complete_copy(t, c);
    t.groups.pop_front();
  }
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  Thread& t = current("ldmatrix");
  t.req = WarpRequest{};
  t.req.kind = Collective::Ldmatrix;
  t.req.addr = addr;
  t.req.trans = trans;
  t.req.regs_out = r;
  t.req.site = __builtin_return_address(0);
  wait_warp(t);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  Thread& t = current("mma.sync");
  t.req = WarpRequest{};
  t.req.kind = Collective::Mma;
  t.req.a = a;
  t.req.b = b;
  t.req.d = d;
  t.req.bf16 = bf16;
  wait_warp(t);
}

int faults_reported() { return g_faults_reported; }

uint64_t emulator_seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("BELAY_EMU_SEED");
    return s && *s ? std::strtoull(s, nullptr, 10) : uint64_t{1};
  }();
  return seed;
}

std::string short_kernel_name(const char* pretty) {
  std::string s(pretty);
  const size_t k = s.find("K = ");
  if (k != std::string::npos) s = s.substr(k + 4);
  if (!s.empty() && s.back() == ']') s.pop_back();
  const size_t semi = s.find(';');  // gcc appends "; ..." for other template parameters
  if (semi != std::string::npos) s = s.substr(0, semi);
  if (!s.empty() && s.front() == '&') s.erase(0, 1);
  for (const char* prefix : {"belay::", "(anonymous namespace)::", "{anonymous}::"})
    for (size_t p; (p = s.find(prefix)) != std::string::npos;) s.erase(p, std::strlen(prefix));
  return s;
}

std::string run_grid(GridLaunch& launch) {
  if (!g_rng_seeded) {
    g_rng.seed(emulator_seed());
    g_rng_seeded = true;
  }
  {
    std::lock_guard<std::mutex> lock(coverage().mutex);
    ++coverage().launches[launch.name];
  }
  const dim3 g = launch.grid;
  const uint64_t blocks = static_cast<uint64_t>(g.x) * g.y * g.z;
  std::vector<uint64_t> order(blocks);
  for (uint64_t i = 0; i < blocks; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), g_rng);
  std::string fault_text;
  static Block b;  // its thread states are reused from block to block
  const bool metrics_on = metrics::enabled();
  if (metrics_on) {
    metrics::begin_launch(launch.name, static_cast<int>(launch.block.x * launch.block.y * launch.block.z));
    g_device_lo = g_device_hi = 0;  // allocations may have been freed since the last launch
  }
  for (uint64_t id : order) {
    b.launch = &launch;
    b.regions.clear();
    b.next_window = 0;
    b.fault.clear();
    b.fault_error = cudaSuccess;
    b.faults = 0;
    b.idx = uint3{static_cast<unsigned>(id % g.x), static_cast<unsigned>((id / g.x) % g.y),
                  static_cast<unsigned>(id / (static_cast<uint64_t>(g.x) * g.y))};
    g_block = &b;
    run_block(b);
    if (metrics_on) metrics::end_block();
    free_regions(b);
    g_block = nullptr;
    if (!b.fault.empty()) {
      g_faults_reported += b.faults;
      fault_text = b.fault;
      launch.fault_error = b.fault_error;
      break;  // a GPU stops the grid at a fault too; the context is lost from here on
    }
  }
  if (metrics_on) metrics::end_launch();
  return fault_text;
}

}  // namespace belay::emu

// ---- The load/store hooks (clang: -fsanitize-coverage=trace-loads,trace-stores) -----------------
// Only the kernel files are built with these; every load and store they make lands here and
// goes to the race check when it touches the running block's shared memory.
extern "C" {
// With the memory metrics on (memory_metrics.h), each access is also counted at its site: the
// hook's return address, an instruction of the kernel code.
#define BELAY_EMU_HOOK(n, type)                                                                           \
  BELAY_EMU_HOT void __sanitizer_cov_load##n(type* p) {                                                   \
    if (__builtin_expect(belay::emu::metrics::g_on, 0))                                                   \
      belay::emu::count_access(p, n, false, __builtin_return_address(0));                                 \
    belay::emu::on_access(p, n, false);                                                                   \
  }                                                                                                       \
  BELAY_EMU_HOT void __sanitizer_cov_store##n(type* p) {                                                  \
    if (__builtin_expect(belay::emu::metrics::g_on, 0))                                                   \
      belay::emu::count_access(p, n, true, __builtin_return_address(0));                                  \
    belay::emu::on_access(p, n, true);                                                                    \
  }
BELAY_EMU_HOOK(1, uint8_t)
BELAY_EMU_HOOK(2, uint16_t)
BELAY_EMU_HOOK(4, uint32_t)
BELAY_EMU_HOOK(8, uint64_t)
BELAY_EMU_HOOK(16, __int128)
#undef BELAY_EMU_HOOK
// trace-loads/stores instrument only beside an edge-coverage kind, here inline-8bit-counters,
// whose module constructors call this to register their counters. libFuzzer and the
// sanitizer runtimes define it; a plain build (no ASan, no fuzzer) has no runtime that
// does, so this empty weak one lets it link, and any runtime's definition takes precedence.
__attribute__((weak)) void __sanitizer_cov_8bit_counters_init(char*, char*) {}
}

// ---- Atomics (cuda_shim.h): a fiber is never switched inside one of these ---------------------
float atomicAdd(float* p, float v) { const float old = *p; *p = old + v; return old; }
double atomicAdd(double* p, double v) { const double old = *p; *p = old + v; return old; }
int atomicAdd(int* p, int v) { const int old = *p; *p = old + v; return old; }
unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned old = *p; *p = old + v; return old; }
int atomicMax(int* p, int v) { const int old = *p; if (v > old) *p = v; return old; }
int atomicCAS(int* p, int compare, int v) { const int old = *p; if (old == compare) *p = v; return old; }
unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) {
  const unsigned old = *p;
  if (old == compare) *p = v;
  return old;
}
