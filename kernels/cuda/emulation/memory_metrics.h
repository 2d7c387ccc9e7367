// Each kernel's memory traffic as Nsight Compute counts it, from the emulator's view of every
// load and store (simt.cpp feeds this file): per kernel and per access site (the instruction,
// named by file:line through the line tables), the accesses of one warp-wide request (same
// site, same warp, the n-th execution of the site by each lane) are grouped and counted:
//  - shared memory: wavefronts against the ideal, one per phase (32 lanes for accesses of up
//    to 4 bytes, 16 for 8 bytes, 8 for 16 bytes and for ldmatrix's rows); within a phase,
//    the distinct 4-byte words one of the 32 banks must serve are its wavefronts, so every
//    wavefront past one per phase is a bank conflict;
//  - global memory: the 32-byte sectors a request touches against the fewest that hold the
//    bytes it asks for (sector efficiency), and per launch the distinct sectors read and
//    written (what DRAM has to move at least) and the tensor-core flops (mma.sync).
// Off unless BELAY_EMU_METRICS names a file (the table is appended to it at exit) or a test
// turns it on: the race check's hot path then pays one predictable branch per access.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace belay::emu::metrics {

extern bool g_on;  // read on every hooked access: a plain global, no call
inline bool enabled() { return g_on; }
void set_enabled(bool on);
void reset();  // forget everything counted so far

enum class Space : uint8_t { Shared, Global };

// ---- Fed by the scheduler (simt.cpp) ---------------------------------------------------------
void begin_launch(const std::string& kernel, int threads_per_block);
void end_block();   // the block's requests are complete: count them
void end_launch();
// One lane's access: `site` the instruction's address (a return address into the kernel code),
// `address` a shared-window address for Space::Shared, a host pointer for Space::Global;
// `vector`: a vector access the source names (load_vector/store_vector, cp.async, ldmatrix).
void access(const void* site, int warp, int lane, Space space, bool write, uint64_t address, uint32_t bytes,
            bool vector = false);
void mma(int count);  // warp-wide mma.sync.m16n8k16 executed (4096 flops each)
// A vector access (load_vector/store_vector, cp.async) was counted at its own site: the
// hooked loads and stores that make it up (clang splits or merges them as it likes) are not
// counted again. Returns whether a hooked access of [p, p + bytes) by `thread` is such a part.
void cover_vector(int thread, const void* p, uint32_t bytes);
bool covered_by_vector(int thread, const void* p, uint32_t bytes);

// ---- Read by tests and the report ----------------------------------------------------------
struct SiteStats {
  std::string kernel;
  std::string location;  // "kernels/cuda/x.cu:12" (the outermost inlined frame), or module+offset
  std::string inlined;   // the innermost frame when it differs ("kernels/cuda/device_access.cuh:57")
  Space space;
  bool write;
  bool vector;           // every access a vector one (load_vector/store_vector, cp.async, ldmatrix)
  int64_t requests = 0;
  int64_t bytes = 0;                           // distinct bytes asked, summed over requests
  int64_t wavefronts = 0, ideal_wavefronts = 0;  // shared
  int64_t sectors = 0, ideal_sectors = 0;        // global
  double efficiency() const;  // ideal / actual (1 when nothing was counted)
};
struct LaunchStats {
  std::string kernel;
  int64_t read_sectors = 0, written_sectors = 0;  // distinct 32-byte sectors of global memory
  int64_t mma = 0;
  double dram_bytes() const { return 32.0 * static_cast<double>(read_sectors + written_sectors); }
  double flops() const { return 4096.0 * static_cast<double>(mma); }
};
std::vector<SiteStats> sites();  // symbolised; ordered by kernel, then location
std::vector<LaunchStats> launches();
// The table: kernel, site, space, requests, wavefronts/ideal, sectors/ideal, efficiency.
std::string table();

}  // namespace belay::emu::metrics
