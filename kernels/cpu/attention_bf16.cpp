// The fused attention for BF16 q, k, v on the paths that multiply BF16 pairs: amx (TDPBF16PS on
// AMX tiles) and avx512bf16 (VDPBF16PS). The algorithm of attention_kernels.cpp (the same tiles
// of kAttnKeys keys, blocks of kQueryRows queries and thread split; its FP32 softmax steps from
// avx512's tiles, the forward's a block at a time: online_softmax_rows) with the products on BF16
// pairs (kernels/cpu/isa/attention_bf16.h: one table per instruction, the same packing and
// roundings in both). Why: the products are the O(T^2 d) work; TDPBF16PS does them several
// times faster than FP32 FMAs (the BF16 GEMM: 3.6-4.3x, docs/cpu-kernels.md), and VDPBF16PS
// does twice an FMA's work per instruction (the Zen 5's GEMM: 174-178 vs 87-89 GFLOP/s on a
// core). On the AMX Xeon VDPBF16PS gives only half the FMA's flops, so there the avx512bf16
// path is slower than the FP32 tiles (docs/attention.md has the measurement); the path is the
// default only where a CPU has AVX512-BF16 and no AMX.
//
// What it rounds that the FP32-tile path does not, as FlashAttention-2 does on tensor cores:
// the probabilities P (forward: exp(s - running max), before the division by l; backward: exp(s -
// lse)) and dS = P (dP - D) are rounded to BF16 (to nearest even) for the products P V, P^T dO,
// dS^T Q and dS K. The scores, dP, every sum and the softmax stay FP32; q, k, v and dO are BF16
// already, so their products are exact. Both instructions read a BF16 below 2^-126 as zero and
// flush an FP32 sum below 2^-126 to zero. docs/attention.md has the error bound.
//
// Layouts (AttentionBf16): A operands are BF16 rows; B operands are pair panels, packed once per
// item for K and V (and Q, dO's transposes for the backward) and once per tile for P and dS. The
// backward computes dV^T = dO^T P and dK^T = Q^T dS, so P and dS need no transposition (their
// row pairs are the panels' pairs) and the tile's dK^T, dV^T are transposed once, at the store.
//
// Work: per item 4 Tq Tk d flops forward (S and P V; about half of it past a causal mask,
// skipped a key tile at a time) and 10 Tq Tk d backward (S again, dP, dV, dK, dQ: bench/attention.cpp
// counts the useful part), on whole 32 x 32 blocks, d rounded up to 32. Bytes: q, k, v (and dO,
// O) read once per item and thread, packed into O(T d) BF16 buffers; out, lse, dq, dk, dv written
// once; S, P, dP, dS live a block at a time in L1.
//
// Determinism: the same split over threads as attention_kernels.cpp (forward: (item, block);
// backward: one thread per item), each output summed in a fixed order on one thread.
#include <algorithm>
#include <vector>

#include "kernels/cpu/attention_parts.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa/attention_bf16.h"
#include "kernels/cpu/isa/attention_tiles.h"

namespace belay::cpu {
namespace {

using namespace attention_parts;

static_assert(kQueryRows == kBf16Block && kAttnKeys % kBf16Block == 0, "blocks and tiles are whole product blocks");
static_assert(kQueryRows <= kAttnMaxRows, "a block's softmax is one online_softmax_rows");

// What a run computes with: the pair products of the path (AMX tiles or VDPBF16PS) and
// avx512's FP32 softmax (both paths have avx512), or, for the tests on any CPU, the tile
// emulator's copy (amx_tiles.h) and baseline's softmax (the same softmax bits: its steps have
// no multiply-add to fuse, attention_tiles.h).
struct Kit {
  const AttentionBf16& x;
  const AttentionTiles& t;
};
const Kit kTiles{isa_amx::attention_amx, isa_avx512::attention_tiles};
const Kit kVdpbf16{isa_avx512bf16::attention_vdpbf16, isa_avx512::attention_tiles};
const Kit kEmulated{isa_amx_emulated::attention_amx, isa_baseline::attention_tiles};

const Kit& active_kit() { return active_cpu_isa() == CpuIsa::Amx ? kTiles : kVdpbf16; }

int64_t up32(int64_t x) { return (x + kBf16Block - 1) / kBf16Block * kBf16Block; }
const uint16_t* bf16_at(const Tensor& t, int64_t offset) { return t.data_as<const uint16_t>() + offset; }

// n rows of d BF16 from x (ld apart) into rows of dp (zero-padded), rows past n up to rows_to zero.
void copy_rows(const uint16_t* x, int64_t n, int64_t d, int64_t ld, int64_t dp, int64_t rows_to, uint16_t* out) {
  std::fill(out, out + rows_to * dp, uint16_t{0});
  for (int64_t r = 0; r < n; ++r) std::copy(x + r * ld, x + r * ld + d, out + r * dp);
}

// One item's operands as the tiles read them (a thread's buffers, reused). kp, vr: K and V as
// B with k along the head dim (S = Q K^T, dP = dO V^T); kc, vc: K and V with k along the keys
// (dS K, P V); q, g: Q and dO rows; qt, gt: their transposes (dK^T = Q^T dS, dV^T = dO^T P).
struct PairItem {
  int64_t item = -1;
  std::vector<uint32_t> kp, vr, kc, vc;
  std::vector<uint16_t> q, g, qt, gt;
};

void pack_keys(const AttentionBf16& x, const Tensor& k, const Tensor& v, const AttentionDims& dims, int64_t item,
               bool backward, PairItem& b) {
  const int64_t d = dims.d, dp = up32(d), tk64 = key_tiles(dims.tk) * kAttnKeys, at = dims.row_at(item, 0, dims.tk);
  const int64_t ld = dims.ld();
  const size_t words = static_cast<size_t>(tk64 * dp / 2);  // each packing of K or V
  b.kp.resize(words);
  x.pack_rows(bf16_at(k, at), ld, dims.tk, d, tk64, b.kp.data());
  if (backward) {
    b.vr.resize(words), b.kc.resize(words);
    x.pack_rows(bf16_at(v, at), ld, dims.tk, d, tk64, b.vr.data());
    x.pack_cols(bf16_at(k, at), ld, dims.tk, d, tk64, b.kc.data());
  } else {
    b.vc.resize(words);
    x.pack_cols(bf16_at(v, at), ld, dims.tk, d, tk64, b.vc.data());
  }
  b.item = backward ? -1 : item;  // the forward reuses an item's keys across its blocks
}

// A forward block's working rows (a thread's, kept between blocks, as attention_kernels.cpp's):
// Q's rows, P in BF16, O, the scores, m and l.
struct BlockScratch {
  std::vector<uint16_t> qb, p;
  std::vector<float> o, s, m, l;
};

// Forward of query rows [i0, i0 + rows) of one item whose keys are packed in b.
void forward_block(const Kit& kit, const Tensor& q, const AttentionDims& dims, const Mask& mask, float scale,
                   int64_t item, int64_t i0, int64_t rows, const PairItem& b, BlockScratch& w, Tensor& out,
                   Tensor& lse) {
  const AttentionBf16& x = kit.x;
  const AttentionTiles& t = kit.t;
  const int64_t d = dims.d, dp = up32(d), ps_k = 16 * dp, ps_v = 16 * key_tiles(dims.tk) * kAttnKeys;
  std::vector<uint16_t>&qb = w.qb, &p = w.p;
  std::vector<float>&o = w.o, &s = w.s, &m = w.m, &l = w.l;
  qb.resize(static_cast<size_t>(kQueryRows * dp));
  p.resize(static_cast<size_t>(kQueryRows * kAttnKeys));
  o.assign(static_cast<size_t>(kQueryRows * dp), 0.0f);
  s.resize(p.size());
  m.assign(static_cast<size_t>(kQueryRows), kNegInf);
  l.assign(static_cast<size_t>(kQueryRows), 0.0f);
  copy_rows(bf16_at(q, dims.row_at(item, i0, dims.tq)), rows, d, dims.ld(), dp, kQueryRows, qb.data());
  const int64_t last = mask.visible(i0 + rows - 1);  // keys [0, last) are seen by some row
  for (int64_t j0 = 0; j0 < last; j0 += kAttnKeys) {
    const int64_t keys = std::min(kAttnKeys, dims.tk - j0);
    x.product(kQueryRows, kAttnKeys, dp, qb.data(), dp, b.kp.data() + j0 / kBf16Block * ps_k, ps_k, s.data(),
              kAttnKeys, false);
    int64_t vis[kQueryRows];  // keys of the tile each row sees (0 for the rows past tq)
    for (int64_t r = 0; r < kQueryRows; ++r)
      vis[r] = r < rows ? std::clamp<int64_t>(mask.visible(i0 + r) - j0, 0, keys) : 0;
    t.online_softmax_rows(s.data(), vis, kQueryRows, scale, m.data(), l.data(), o.data(), dp, dp);
    x.round_rows(s.data(), kQueryRows, kAttnKeys, p.data());
    x.product(kQueryRows, dp, kAttnKeys, p.data(), kAttnKeys, b.vc.data() + j0 / 2 * kBf16Block, ps_v, o.data(), dp,
              true);  // O += P V
  }
  finish_rows(o.data(), dp, m.data(), l.data(), dims, item, i0, rows, out, lse);
}

void forward(const Kit& kit, const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
             const AttentionDims& dims, Tensor& out, Tensor& lse) {
  const Mask mask{causal, dims.tq, dims.tk};
  const int64_t blocks = (dims.tq + kQueryRows - 1) / kQueryRows, pairs = dims.items * blocks;
  const double work = static_cast<double>(dims.items) * dims.tq * dims.tk * dims.d;
#pragma omp parallel if (work > kParallelThreshold)
  {
    PairItem b;
    BlockScratch w;
    kit.x.begin();  // tile state is per thread
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t item = p / blocks, i0 = p % blocks * kQueryRows;
      if (b.item != item) pack_keys(kit.x, k, v, dims, item, false, b);
      forward_block(kit, q, dims, mask, scale, item, i0, std::min(kQueryRows, dims.tq - i0), b, w, out, lse);
    }
    kit.x.end();
  }
}

// The backward's per-item operands (b) and D = rowsum(dO O).
void load_backward_item(const AttentionBf16& x, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& dout, const AttentionDims& dims, int64_t item, PairItem& b,
                        std::vector<float>& dsum) {
  const int64_t d = dims.d, dp = up32(d), tq32 = up32(dims.tq), at = dims.row_at(item, 0, dims.tq);
  pack_keys(x, k, v, dims, item, true, b);
  b.q.resize(static_cast<size_t>(tq32 * dp)), b.g.resize(b.q.size());
  b.qt.resize(b.q.size()), b.gt.resize(b.q.size());
  copy_rows(bf16_at(q, at), dims.tq, d, dims.ld(), dp, tq32, b.q.data());
  copy_rows(bf16_at(dout, at), dims.tq, d, dims.ld(), dp, tq32, b.g.data());
  x.transpose(b.q.data(), tq32, dp, b.qt.data());
  x.transpose(b.g.data(), tq32, dp, b.gt.data());
  output_dots(out, dout, dims, item, dsum);
}

// dV^T and dK^T take their query rows kGroupRows at a time (the sum over the rows is the
// depth of their product): each pass over their C tiles (loaded, added to, stored) then does
// four blocks' work, not one's.
constexpr int64_t kGroupRows = 4 * kQueryRows;

// A tile's scratch: S and dP of one block in FP32; P and dS in BF16 as the products read them:
// dS's rows for dQ (one block), P and dS as pair panels for dV^T and dK^T (a group of blocks).
struct TileScratch {
  std::vector<float> s = std::vector<float>(kQueryRows * kAttnKeys), dpv = s;
  std::vector<uint32_t> p_pairs = std::vector<uint32_t>(kGroupRows * kAttnKeys / 2), ds_pairs = p_pairs;
  std::vector<uint16_t> ds_rows = std::vector<uint16_t>(kQueryRows * kAttnKeys);
};

// Query rows [i0, i0 + rows) against key tile j0: S, dP, then P and dS, rounded into w's panels
// at the block's place in its group (`slot`), and the block's dQ += dS K.
void backward_block(const Kit& kit, const AttentionDims& dims, const Mask& mask, float scale, int64_t j0, int64_t i0,
                    int64_t slot, const float* lse, const std::vector<float>& dsum, const PairItem& b, TileScratch& w,
                    std::vector<float>& dq) {
  const AttentionBf16& x = kit.x;
  const int64_t dp = up32(dims.d), rows = std::min(kQueryRows, dims.tq - i0), keys = std::min(kAttnKeys, dims.tk - j0);
  const int64_t ps_k = 16 * dp, ps_kc = 16 * key_tiles(dims.tk) * kAttnKeys, ps_g = 16 * kGroupRows;
  x.product(kQueryRows, kAttnKeys, dp, b.q.data() + i0 * dp, dp, b.kp.data() + j0 / kBf16Block * ps_k, ps_k,
            w.s.data(), kAttnKeys, false);  // S = Q K^T
  x.product(kQueryRows, kAttnKeys, dp, b.g.data() + i0 * dp, dp, b.vr.data() + j0 / kBf16Block * ps_k, ps_k,
            w.dpv.data(), kAttnKeys, false);  // dP = dO V^T
  probabilities_block(w.s.data(), w.dpv.data(), i0, rows, j0, keys, scale, mask, lse, dsum.data(), kit.t);
  std::fill(w.s.begin() + rows * kAttnKeys, w.s.end(), 0.0f);  // rows past tq: no P, no dS
  std::fill(w.dpv.begin() + rows * kAttnKeys, w.dpv.end(), 0.0f);
  const int64_t at = slot * kQueryRows / 2 * kBf16Block;  // the block's first pair in each panel
  x.round_pairs(w.s.data(), kQueryRows, kAttnKeys, ps_g, w.p_pairs.data() + at);
  x.round_pairs(w.dpv.data(), kQueryRows, kAttnKeys, ps_g, w.ds_pairs.data() + at);
  x.round_rows(w.dpv.data(), kQueryRows, kAttnKeys, w.ds_rows.data());
  x.product(kQueryRows, dp, kAttnKeys, w.ds_rows.data(), kAttnKeys, b.kc.data() + j0 / 2 * kBf16Block, ps_kc,
            dq.data() + i0 * dp, dp, true);  // dQ += dS K
}

// dK^T and dV^T ([dp, kAttnKeys]) of one key tile, accumulated over the query blocks that see
// it, and its share of dQ added into dq (FP32 rows of dp).
void backward_tile(const Kit& kit, const AttentionDims& dims, const Mask& mask, float scale, int64_t j0,
                   const float* lse, const std::vector<float>& dsum, const PairItem& b, TileScratch& w,
                   std::vector<float>& dq, float* dkt, float* dvt) {
  const AttentionBf16& x = kit.x;
  const int64_t dp = up32(dims.d), tq32 = up32(dims.tq), ps_g = 16 * kGroupRows;
  std::fill(dkt, dkt + dp * kAttnKeys, 0.0f);
  std::fill(dvt, dvt + dp * kAttnKeys, 0.0f);
  for (int64_t g0 = mask.first_query(j0) / kQueryRows * kQueryRows; g0 < dims.tq; g0 += kGroupRows) {
    const int64_t depth = std::min(kGroupRows, tq32 - g0);  // whole blocks
    for (int64_t slot = 0; slot * kQueryRows < depth; ++slot)
      backward_block(kit, dims, mask, scale, j0, g0 + slot * kQueryRows, slot, lse, dsum, b, w, dq);
    x.product(dp, kAttnKeys, depth, b.gt.data() + g0, tq32, w.p_pairs.data(), ps_g, dvt, kAttnKeys, true);
    x.product(dp, kAttnKeys, depth, b.qt.data() + g0, tq32, w.ds_pairs.data(), ps_g, dkt, kAttnKeys, true);
  }
}

// The first n columns of xt ([d, kAttnKeys], column j = key j), times factor, into t's rows
// (ld apart) from element offset.
void store_columns(const float* xt, int64_t n, int64_t d, float factor, Tensor& t, int64_t offset, int64_t ld) {
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < d; ++c) row[c] = xt[c * kAttnKeys + j] * factor;
    store_block(t.data(), t.dtype(), offset + j * ld, d, row.data());
  }
}

void backward(const Kit& kit, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
              const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq, Tensor& dk,
              Tensor& dv) {
  const Mask mask{causal, dims.tq, dims.tk};
  const int64_t d = dims.d, dp = up32(d);
  const double work = static_cast<double>(dims.items) * dims.tq * dims.tk * dims.d;
#pragma omp parallel if (work > kParallelThreshold)
  {
    PairItem b;
    TileScratch w;
    std::vector<float> dsum, dqf, dkt(static_cast<size_t>(dp * kAttnKeys)), dvt(dkt.size());
    kit.x.begin();
#pragma omp for schedule(static)
    for (int64_t item = 0; item < dims.items; ++item) {
      load_backward_item(kit.x, q, k, v, out, dout, dims, item, b, dsum);
      dqf.assign(static_cast<size_t>(up32(dims.tq) * dp), 0.0f);
      const float* lse_item = lse.data_as<float>() + item * dims.tq;
      for (int64_t j0 = 0; j0 < dims.tk; j0 += kAttnKeys) {
        backward_tile(kit, dims, mask, scale, j0, lse_item, dsum, b, w, dqf, dkt.data(), dvt.data());
        const int64_t keys = std::min(kAttnKeys, dims.tk - j0);
        store_columns(dkt.data(), keys, d, scale, dk, dims.row_at(item, j0, dims.tk), dims.ld());
        store_columns(dvt.data(), keys, d, 1.0f, dv, dims.row_at(item, j0, dims.tk), dims.ld());
      }
      store_rows(dqf.data(), dims.tq, d, dp, scale, dq, dims.row_at(item, 0, dims.tq), dims.ld());
    }
    kit.x.end();
  }
}

}  // namespace

bool attention_on_bf16_pairs(const Tensor& q) {
  const CpuIsa isa = active_cpu_isa();
  return q.dtype() == DType::BF16 && (isa == CpuIsa::Amx || isa == CpuIsa::Avx512Bf16);
}

void attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                    const AttentionDims& dims, Tensor& out, Tensor& lse) {
  forward(active_kit(), q, k, v, causal, scale, dims, out, lse);
}
void attention_backward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Tensor& dout, bool causal, float scale, const AttentionDims& dims, Tensor& dq,
                             Tensor& dk, Tensor& dv) {
  backward(active_kit(), q, k, v, out, lse, dout, causal, scale, dims, dq, dk, dv);
}

void attention_amx_emulated(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                            const AttentionDims& dims, Tensor& out, Tensor& lse) {
  forward(kEmulated, q, k, v, causal, scale, dims, out, lse);
}
void attention_backward_amx_emulated(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, bool causal, float scale,
                                     const AttentionDims& dims, Tensor& dq, Tensor& dk, Tensor& dv) {
  backward(kEmulated, q, k, v, out, lse, dout, causal, scale, dims, dq, dk, dv);
}

}  // namespace belay::cpu
