// The census of the casts mixed precision makes (issue: what FP16/BF16 did to each tensor),
// counted by Backend::cast_census in the cast's own read (engine/census.h's classes, against
// the format cast into):
//  - the forward's autocast casts of activations, from FP32 into the autocast dtype, one site per
//    (module, op class, operand): "blocks.0.mlp.fc.linear.input", "blocks.0.attn.attention.q";
//  - the parameters' working copies, FP16/BF16 roundings of their FP32 masters
//    (census_weights: the copy is written again with the bits it holds), one site per parameter;
//  - the rounding of each weight gradient into an FP16/BF16 gradient buffer (--grad-dtype
//    compute), one site per parameter: what the gradient lost before the guard could see it.
// While a CastCensusScope is open on a thread, autograd's casts on that thread are counted into
// its CastCensus; each site's record gathers every cast of that site (micro-batches included)
// until read() is called.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/graph.h"
#include "engine/census.h"

namespace belay {

// What a counted cast rounds: an operand of the forward, or a gradient into its buffer.
enum class CastSite { Forward, GradBuffer };

class CastCensus {
 public:
  // forward: count the forward's casts (CastSite::Forward) too; the gradient buffers' roundings
  // are always counted.
  explicit CastCensus(bool forward = true) : forward_(forward) {}
  bool counts_forward() const { return forward_; }
  // dst = src cast (src FP32, dst FP16 or BF16, as Backend::cast), counted into the record of
  // (kind, site).
  void cast(CastSite kind, const std::string& site, const Tensor& src, Tensor& dst);
  // Each parameter's working copy cast again from its master (the same bits), counted under
  // its name; parameters without a low-precision copy or without a master here are left out.
  void census_weights(const std::vector<Var>& params);
  // The sites of one kind in the order first seen, their counts since they were last taken
  // (copied on the device: nothing is read back here); those records start again from zero.
  struct Taken {
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    std::vector<Tensor> records;
    std::vector<TensorCensus> decode() const;  // reads the copies back (waits for them)
  };
  Taken take(CastSite kind);

 private:
  struct Site {
    CastSite kind;
    std::string name;
    int64_t numel = 0;  // elements counted into the record since the last read
    Tensor record;      // FP32 [kCensusFields] words, on the casts' device
  };
  bool forward_;
  std::vector<Site> sites_;
  std::unordered_map<std::string, size_t> index_[2];  // by kind
};

// The census this thread's casts count into (null: none).
CastCensus* active_cast_census();

class CastCensusScope {
 public:
  explicit CastCensusScope(CastCensus* census);
  ~CastCensusScope();
  CastCensusScope(const CastCensusScope&) = delete;
  CastCensusScope& operator=(const CastCensusScope&) = delete;

 private:
  CastCensus* saved_;
};

// Whether a cast from `from` to `to` is one the census counts: FP32 into FP16 or BF16.
bool counted_cast(DType from, DType to);
// x cast to `dtype`: through `census` (non-null) under (kind, site) when the cast is counted;
// else x.to(dtype).
Tensor cast_counted(CastCensus* census, CastSite kind, const Tensor& x, DType dtype, const std::string& site);

}  // namespace belay
