// The CPU backend's fused attention, forward and backward (kernels/cpu/cpu_kernels.h):
// FlashAttention-2's algorithm on tiles of kAttnKeys keys, the tile products on the active ISA
// path (kernels/cpu/isa/attention_tiles.cpp), in FP32. BF16 inputs on the amx and avx512bf16
// paths go to kernels/cpu/attention_bf16.cpp instead (the same algorithm, its products on BF16
// pairs: AMX tiles, VDPBF16PS).
// docs/attention.md says what is kept and why.
//
// Memory: the scores exist a tile at a time (kQueryRows x kAttnKeys floats, in L1). Each
// thread transposes the item it works on (K^T, and V^T for the backward) into FP32 buffers of
// O(T d), and reads its Q, K, V and dO rows in place where they are FP32 with a head dim of whole
// vectors, else widened into such buffers (item_rows); the outputs are out and one FP32 lse per
// query row. Nothing is O(T^2).
//
// Determinism: every output element is computed by one thread in a fixed order (key tiles in
// order, rows in order), so the bits do not depend on the thread count. The forward splits the
// work over (item, query block); the backward over items (a key tile's dK and dV sum over every
// query block, and a query's dQ over every key tile: one thread per item keeps both sums in
// order without atomics or a second pass).
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_parts.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/attention_tiles.h"

namespace belay::cpu {
namespace {

using namespace attention_parts;

const AttentionTiles& attention_tiles() {
  switch (active_cpu_isa()) {
    case CpuIsa::Avx2: return isa_avx2::attention_tiles;
    case CpuIsa::Avx512:
    case CpuIsa::Avx512Bf16:
    case CpuIsa::Amx: return isa_avx512::attention_tiles;  // (BF16 inputs go to attention_bf16.cpp)
    case CpuIsa::Baseline: break;
  }
  return isa_baseline::attention_tiles;
}

int64_t padded(int64_t d) { return (d + kAttnPad - 1) / kAttnPad * kAttnPad; }

// rows x d elements of a tensor from element `offset` (rows ld apart) as FP32 rows of dp
// floats, zero-padded.
void widen_rows(const Tensor& t, int64_t offset, int64_t rows, int64_t d, int64_t ld, int64_t dp, float* out) {
  std::vector<float> buf(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = load_block(t.data(), t.dtype(), offset + r * ld, d, buf.data());
    std::copy(row, row + d, out + r * dp);
    std::fill(out + r * dp + d, out + (r + 1) * dp, 0.0f);
  }
}

// FP32 rows as the tiles read them: row r at p + r ld, dp floats each (zero past d).
struct Rows {
  const float* p = nullptr;
  int64_t ld = 0;
  const float* row(int64_t r) const { return p + r * ld; }
};

// rows x d elements of an operand from element `offset` (rows ld apart) as Rows: in place where
// the tensor is FP32 and d a whole number of vectors (d = dp: heads of 16, 32, 64, 128), else
// widened into buf. In place, the copies' memcpy of 128 bytes a row (a head of 32) are gone: 2%
// of the default GPT's fp32 step's samples (perf, 1 thread).
Rows item_rows(const Tensor& t, int64_t offset, int64_t rows, int64_t d, int64_t ld, int64_t dp, std::vector<float>& buf) {
  if (t.dtype() == DType::F32 && d == dp) return Rows{t.data_as<float>() + offset, ld};
  buf.resize(static_cast<size_t>(rows * dp));
  widen_rows(t, offset, rows, d, ld, dp, buf.data());
  return Rows{buf.data(), dp};
}

constexpr int64_t kPrefetchRows = 8;  // transpose_tiles' prefetch distance, in keys

// n rows transposed a tile at a time: tile t is [d, kAttnKeys] (key t kAttnKeys + j in
// column j), contiguous, the tiles one after another; keys past n are zero. Tile-major, not one
// [d, n] matrix: a tile's d rows 4 KiB apart (n = 1024) would all fall into the same few L1
// sets and evict each other on every pass of dot_tile.
// Four keys by four columns at a time (SSE, every path: bit moves only), the rest one by one,
// the rows kPrefetchRows keys ahead asked for a line at a time. One float at a time and without
// the prefetch, K's and V's transposes were 1.7% of the default GPT's fp32 step's samples (Zen 4,
// perf, 1 thread), most of it the loads' wait for rows not yet in the cache; now 1.0%.
void transpose_tiles(const Rows& rows, int64_t n, int64_t d, float* out) {
  if (const int64_t used = n % kAttnKeys; used != 0) {  // the last tile's columns past n: zero
    float* last = out + n / kAttnKeys * kAttnKeys * d;
    for (int64_t c = 0; c < d; ++c) std::fill(last + c * kAttnKeys + used, last + (c + 1) * kAttnKeys, 0.0f);
  }
  const int64_t n4 = n / 4 * 4, d4 = d / 4 * 4;  // kAttnKeys is a multiple of 4: a quad stays in its tile
  for (int64_t j = 0; j < n4; j += 4) {
    float* tile = out + j / kAttnKeys * kAttnKeys * d + j % kAttnKeys;
    const float* r[4] = {rows.row(j), rows.row(j + 1), rows.row(j + 2), rows.row(j + 3)};
    for (int64_t q = j + kPrefetchRows; q < std::min(n, j + kPrefetchRows + 4); ++q)
      for (int64_t c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(rows.row(q) + c), _MM_HINT_T0);
    for (int64_t c = 0; c < d4; c += 4) {
      __m128 x0 = _mm_loadu_ps(r[0] + c), x1 = _mm_loadu_ps(r[1] + c);
      __m128 x2 = _mm_loadu_ps(r[2] + c), x3 = _mm_loadu_ps(r[3] + c);
      _MM_TRANSPOSE4_PS(x0, x1, x2, x3);  // x_i: column c + i of the four keys
      _mm_storeu_ps(tile + c * kAttnKeys, x0);
      _mm_storeu_ps(tile + (c + 1) * kAttnKeys, x1);
      _mm_storeu_ps(tile + (c + 2) * kAttnKeys, x2);
      _mm_storeu_ps(tile + (c + 3) * kAttnKeys, x3);
    }
    for (int64_t c = d4; c < d; ++c)
      for (int q = 0; q < 4; ++q) tile[c * kAttnKeys + q] = r[q][c];
  }
  for (int64_t j = n4; j < n; ++j) {
    float* tile = out + j / kAttnKeys * kAttnKeys * d;
    const float* row = rows.row(j);
    for (int64_t c = 0; c < d; ++c) tile[c * kAttnKeys + j % kAttnKeys] = row[c];
  }
}

// One item's operands in FP32 as the tiles read them: Rows of Q, dO, K and V (in place, or in
// the thread's buffers, reused), K^T and V^T tiles.
struct ItemBuffers {
  int64_t item = -1;
  std::vector<float> q, dout, k, v, kt, vt;
  Rows qr, gr, kr, vr;
  // A block's working rows, kept between blocks (allocated per block they were 1.7% of the
  // default GPT's attention): the forward's Q rows where widened, O, m and l; the scores and
  // dP (the backward's dS) of one tile.
  std::vector<float> qf, o, m, l, s, dpv;
};

static_assert(kQueryRows <= kAttnMaxRows, "a block's softmax is one online_softmax_rows");

// Forward of query rows [i0, i0 + rows) of one item whose K^T and V are in b.
void forward_block(const Tensor& q, const AttentionDims& dims, const Mask& mask, float scale, int64_t item, int64_t i0,
                   int64_t rows, ItemBuffers& b, Tensor& out, Tensor& lse) {
  const AttentionTiles& t = attention_tiles();
  const int64_t d = dims.d, dp = padded(d);
  std::vector<float>&o = b.o, &s = b.s, &m = b.m, &l = b.l;
  o.assign(static_cast<size_t>(rows * dp), 0.0f);
  s.resize(static_cast<size_t>(rows * kAttnKeys));
  m.assign(static_cast<size_t>(rows), kNegInf);
  l.assign(static_cast<size_t>(rows), 0.0f);
  const Rows qr = item_rows(q, dims.row_at(item, i0, dims.tq), rows, d, dims.ld(), dp, b.qf);
  const int64_t last = mask.visible(i0 + rows - 1);  // keys [0, last) are seen by some row
  for (int64_t j0 = 0; j0 < last; j0 += kAttnKeys) {
    const int64_t keys = std::min(kAttnKeys, dims.tk - j0), span = std::min(keys, last - j0);
    t.dot_tile(qr.p, qr.ld, rows, b.kt.data() + j0 * d, kAttnKeys, d, span, s.data());
    int64_t vis[kQueryRows];  // keys of the tile each row sees (0: none, its scores become 0)
    for (int64_t r = 0; r < rows; ++r) vis[r] = std::clamp<int64_t>(mask.visible(i0 + r) - j0, 0, keys);
    // The block's rows in one call: on avx512 the tile's max and sum take a few vector steps
    // where a row at a time ran a chain of dependent scalar operations (the same results).
    t.online_softmax_rows(s.data(), vis, rows, scale, m.data(), l.data(), o.data(), dp, dp);
    t.weigh_rows(s.data(), rows, span, b.vr.row(j0), b.vr.ld, dp, o.data(), dp);
  }
  finish_rows(o.data(), dp, m.data(), l.data(), dims, item, i0, rows, out, lse);
}

// K^T and V of one item into b (once per item a thread meets).
void load_keys(const Tensor& k, const Tensor& v, const AttentionDims& dims, int64_t item, ItemBuffers& b) {
  const int64_t d = dims.d, dp = padded(d), ldk = key_tiles(dims.tk) * kAttnKeys;
  b.kt.resize(static_cast<size_t>(d * ldk));
  b.kr = item_rows(k, dims.row_at(item, 0, dims.tk), dims.tk, d, dims.ld(), dp, b.k);
  b.vr = item_rows(v, dims.row_at(item, 0, dims.tk), dims.tk, d, dims.ld(), dp, b.v);
  transpose_tiles(b.kr, dims.tk, d, b.kt.data());
  b.item = item;
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, const AttentionDims& dims,
               Tensor& out, Tensor& lse) {
  if (attention_on_bf16_pairs(q)) return attention_bf16(q, k, v, causal, scale, dims, out, lse);
  const Mask mask{causal, dims.tq, dims.tk};
  const int64_t blocks = (dims.tq + kQueryRows - 1) / kQueryRows, pairs = dims.items * blocks;
  const double work = static_cast<double>(dims.items) * dims.tq * dims.tk * dims.d;
#pragma omp parallel if (work > kParallelThreshold)
  {
    ItemBuffers b;
    // Consecutive pairs share an item: a thread widens each item's K and V once.
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t item = p / blocks, i0 = p % blocks * kQueryRows;
      if (b.item != item) load_keys(k, v, dims, item, b);
      forward_block(q, dims, mask, scale, item, i0, std::min(kQueryRows, dims.tq - i0), b, out, lse);
    }
  }
}

namespace {

// The backward's per-item operands: Q, dO, K rows, K^T and V^T in FP32, and D = rowsum(dO O).
void load_backward_item(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                        const AttentionDims& dims, int64_t item, ItemBuffers& b, std::vector<float>& dsum) {
  const int64_t d = dims.d, dp = padded(d), ldk = key_tiles(dims.tk) * kAttnKeys;
  load_keys(k, v, dims, item, b);
  b.vt.resize(static_cast<size_t>(d * ldk));
  transpose_tiles(b.vr, dims.tk, d, b.vt.data());
  b.qr = item_rows(q, dims.row_at(item, 0, dims.tq), dims.tq, d, dims.ld(), dp, b.q);
  b.gr = item_rows(dout, dims.row_at(item, 0, dims.tq), dims.tq, d, dims.ld(), dp, b.dout);
  output_dots(out, dout, dims, item, dsum);
}

// dK and dV of one key tile (accumulated over the query blocks that see it), and its share of
// dQ added into dq (FP32, padded rows).
void backward_tile(const AttentionDims& dims, const Mask& mask, float scale, int64_t j0, const float* lse,
                   const std::vector<float>& dsum, ItemBuffers& b, std::vector<float>& dq, float* dk, float* dv) {
  const AttentionTiles& t = attention_tiles();
  const int64_t d = dims.d, dp = padded(d);
  const int64_t keys = std::min(kAttnKeys, dims.tk - j0);
  std::vector<float>&s = b.s, &dpv = b.dpv;
  s.resize(static_cast<size_t>(kQueryRows * kAttnKeys));
  dpv.resize(s.size());
  std::fill(dk, dk + kAttnKeys * dp, 0.0f);
  std::fill(dv, dv + kAttnKeys * dp, 0.0f);
  for (int64_t i0 = mask.first_query(j0); i0 < dims.tq; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, dims.tq - i0);
    // The tile's keys some row of the block sees: the products stop there (P and dS are 0 past
    // it, so the sums are the same).
    const int64_t span = std::clamp<int64_t>(mask.visible(i0 + rows - 1) - j0, 0, keys);
    if (span == 0) continue;
    const float* qb = b.qr.row(i0);
    const float* gb = b.gr.row(i0);
    t.dot_tile(qb, b.qr.ld, rows, b.kt.data() + j0 * d, kAttnKeys, d, span, s.data());
    t.dot_tile(gb, b.gr.ld, rows, b.vt.data() + j0 * d, kAttnKeys, d, span, dpv.data());
    probabilities_block(s.data(), dpv.data(), i0, rows, j0, keys, scale, mask, lse, dsum.data(), t);
    t.weigh_cols(s.data(), rows, span, gb, b.gr.ld, dp, dv, dp);    // dV += P^T dO
    t.weigh_cols(dpv.data(), rows, span, qb, b.qr.ld, dp, dk, dp);  // dK += dS^T Q
    t.weigh_rows(dpv.data(), rows, span, b.kr.row(j0), b.kr.ld, dp, dq.data() + i0 * dp, dp);  // dQ += dS K
  }
}

}  // namespace

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  if (attention_on_bf16_pairs(q))
    return attention_backward_bf16(q, k, v, out, lse, dout, causal, scale, dims, dq, dk, dv);
  const Mask mask{causal, dims.tq, dims.tk};
  const int64_t d = dims.d, dp = padded(d);
  const double work = static_cast<double>(dims.items) * dims.tq * dims.tk * dims.d;
#pragma omp parallel if (work > kParallelThreshold)
  {
    ItemBuffers b;
    std::vector<float> dsum, dqf, dkt(static_cast<size_t>(kAttnKeys * dp)), dvt(dkt.size());
#pragma omp for schedule(static)
    for (int64_t item = 0; item < dims.items; ++item) {
      load_backward_item(q, k, v, out, dout, dims, item, b, dsum);
      dqf.assign(static_cast<size_t>(dims.tq * dp), 0.0f);
      const float* lse_item = lse.data_as<float>() + item * dims.tq;
      for (int64_t j0 = 0; j0 < dims.tk; j0 += kAttnKeys) {
        backward_tile(dims, mask, scale, j0, lse_item, dsum, b, dqf, dkt.data(), dvt.data());
        const int64_t keys = std::min(kAttnKeys, dims.tk - j0);
        store_rows(dkt.data(), keys, d, dp, scale, dk, dims.row_at(item, j0, dims.tk), dims.ld());
        store_rows(dvt.data(), keys, d, dp, 1.0f, dv, dims.row_at(item, j0, dims.tk), dims.ld());
      }
      store_rows(dqf.data(), dims.tq, d, dp, scale, dq, dims.row_at(item, 0, dims.tq), dims.ld());
    }
  }
}

}  // namespace belay::cpu
