#include "amp/dist/shard_plan.h"

#include <algorithm>
#include <numeric>

#include "engine/error.h"

namespace belay {

std::string ShardPlan::text() const {
  std::string s = std::to_string(world_size) + ":";
  for (size_t i = 0; i < owner.size(); ++i) s += (i ? "," : "") + std::to_string(owner[i]);
  return s;
}

// Largest first (LPT): the big tensors (a GPT's embedding) are placed while every rank is
// still empty, and the small ones even out what is left.
ShardPlan plan_shards(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw Error("plan_shards: world size must be >= 1");
  ShardPlan plan;
  plan.world_size = world_size;
  plan.owner.assign(numels.size(), 0);
  plan.rank_numel.assign(static_cast<size_t>(world_size), 0);
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  for (size_t i : order) {
    const auto least = std::min_element(plan.rank_numel.begin(), plan.rank_numel.end());
    plan.owner[i] = static_cast<int>(least - plan.rank_numel.begin());
    *least += numels[i];
  }
  return plan;
}

}  // namespace belay
