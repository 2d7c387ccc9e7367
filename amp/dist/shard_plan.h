// Which rank keeps which parameter's optimizer state when the state is sharded across
// data-parallel ranks (`--shard-optimizer`, ZeRO stage 1). Shards are whole tensors: the
// gradient sum, the guard's per-tensor sums of squares and AdamW's update of a tensor then
// happen on one rank, in the same order as without sharding, so the sharded run keeps the
// unsharded run's bits (docs/data-parallel.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace belay {

struct ShardPlan {
  int world_size = 1;
  std::vector<int> owner;           // per parameter (optimizer order): the rank that updates it
  std::vector<int64_t> rank_numel;  // per rank: elements owned (state bytes are proportional)
  // "N:o0,o1,...": the layout as a checkpoint records it (for readers; a resume recomputes it).
  std::string text() const;
};

// Balanced by size, deterministic: the parameters from the largest down (equal sizes in
// parameter order), each to the rank holding the fewest elements so far (ties: the lowest
// rank). Depends on the sizes and the world size alone, so every rank computes the same plan.
ShardPlan plan_shards(const std::vector<int64_t>& numels, int world_size);

}  // namespace belay
