// The machine's memory limit, measured the STREAM way: copy (b = a) and triad
// (a = b + s*c) over float arrays far larger than the last-level cache, and a read-only sum
// (the limit of a pass that only reads, as the guard's over the gradients). Bytes counted as
// STREAM counts them (reads + writes, no write-allocate), so the AMP-step numbers, counted
// the same way, compare with them directly.
//
// A plain store first reads the line it writes (read-for-ownership), so a plain copy moves
// 3 bytes through the memory per 2 counted: it undercounts what the memory can do. The
// copy with non-temporal stores skips that read, as the AMP step's streaming working copy
// does; the reference the AMP step is compared with is the better of the two.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include <cstdint>
#include <memory>
#include <string>

#include "bench/sections.h"
#include "engine/error.h"

namespace belay::bench {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer make_buffer(size_t n, float value) {
  Buffer b(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)));
  if (!b) throw Error("stream: out of memory");
  float* p = b.get();
  // First touch by the threads that will use each page.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) p[i] = value + static_cast<float>(i & 1023);
  return b;
}

void copy(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// b = a with non-temporal stores (SSE2, every x86-64), each thread's range starting on a
// 64-byte line; sfence makes the streamed lines visible before the region ends.
void copy_nt(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = (n / nt + 15) / 16 * 16;
    const int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    int64_t i = lo;
    for (; i + 4 <= hi; i += 4) _mm_stream_ps(dst + i, _mm_load_ps(src + i));
    for (; i < hi; ++i) dst[i] = src[i];
    _mm_sfence();
  }
}

// The sum of a, read once: each thread its own range, four independent SSE accumulators (so
// the adds' latency does not bound it), summed in double at the end.
double read_sum(const float* a, int64_t n) {
  double total = 0.0;
#pragma omp parallel reduction(+ : total)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = (n / nt + 15) / 16 * 16;
    const int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16)
      for (int q = 0; q < 4; ++q) acc[q] = _mm_add_ps(acc[q], _mm_load_ps(a + i + 4 * q));
    alignas(16) float lanes[4];
    for (int q = 0; q < 4; ++q) {
      _mm_store_ps(lanes, acc[q]);
      for (float l : lanes) total += l;
    }
    for (; i < hi; ++i) total += a[i];
  }
  return total;
}

void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace

int max_threads() { return omp_get_max_threads(); }

double stream_copy_gbs(size_t bytes_per_array, int reps) {
  const size_t n = bytes_per_array / sizeof(float);
  Buffer a = make_buffer(n, 1.0f), b = make_buffer(n, 0.0f);
  const Timing t = time_it(1, reps, [&] { copy(b.get(), a.get(), static_cast<int64_t>(n)); });
  require(b[n - 1] == a[n - 1] && b[n / 3] == a[n / 3], "stream copy result");
  std::fill(b.get(), b.get() + n, 0.0f);
  const Timing tn = time_it(1, reps, [&] { copy_nt(b.get(), a.get(), static_cast<int64_t>(n)); });
  require(b[n - 1] == a[n - 1] && b[n / 3] == a[n / 3], "stream copy (non-temporal) result");
  return 2.0 * static_cast<double>(n * sizeof(float)) / (std::min(t.median_ms, tn.median_ms) * 1e6);
}

Json bench_stream(const Options& o) {
  // 256 MiB per array: 8x the 32 MiB L3 of this machine, and of most desktop parts.
  const size_t bytes = (o.quick ? 64ull : 256ull) << 20;
  const size_t n = bytes / sizeof(float);
  const int reps = o.quick ? 3 : 10;
  Buffer a = make_buffer(n, 1.0f), b = make_buffer(n, 2.0f), c = make_buffer(n, 3.0f);
  const int64_t ni = static_cast<int64_t>(n);

  const Timing tc = time_it(2, reps, [&] { copy(b.get(), a.get(), ni); });
  require(b[0] == a[0] && b[n - 1] == a[n - 1] && b[n / 2] == a[n / 2], "stream copy result");
  std::fill(b.get(), b.get() + n, 2.0f);
  const Timing tn = time_it(2, reps, [&] { copy_nt(b.get(), a.get(), ni); });
  require(b[0] == a[0] && b[n - 1] == a[n - 1] && b[n / 2] == a[n / 2], "stream copy (non-temporal) result");
  std::fill(b.get(), b.get() + n, 2.0f);
  const Timing tt = time_it(2, reps, [&] { triad(a.get(), b.get(), c.get(), 3.0f, ni); });
  for (size_t i : {size_t{0}, n / 2, n - 1}) require(a[i] == b[i] + 3.0f * c[i], "stream triad result");
  // c holds 3 + (i & 1023): its sum in double, against which the FP32 partial sums (each of
  // about n / 16 / threads values near 500) must agree to 1e-3.
  double sum = 0.0;
  const Timing tr = time_it(2, reps, [&] { sum = read_sum(c.get(), ni); });
  const double want = static_cast<double>(n / 1024) * (3.0 * 1024 + 1023.0 * 1024 / 2);
  require(n % 1024 == 0 && std::abs(sum / want - 1.0) < 1e-3, "stream read result");

  auto row = [&](const char* name, const Timing& t, double moved) {
    return Json{{"name", name},
                {"array_bytes", bytes},
                {"bytes_moved", moved},
                {"time", to_json(t)},
                {"gb_per_s", moved / (t.median_ms * 1e6)},
                {"gb_per_s_best", moved / (t.min_ms * 1e6)}};
  };
  return Json{{"threads", max_threads()},
              {"copy", row("copy", tc, 2.0 * static_cast<double>(bytes))},
              {"copy_nt", row("copy_nt", tn, 2.0 * static_cast<double>(bytes))},
              {"triad", row("triad", tt, 3.0 * static_cast<double>(bytes))},
              {"read", row("read", tr, static_cast<double>(bytes))}};
}

}  // namespace belay::bench
