// The shard plan of a sharded optimizer (amp/dist/shard_plan.h): whole tensors, balanced by
// size, the same on every call, and the guard's partial sums combined across ranks into the
// unsharded norm (Communicator::agree_on_partials, with one rank: nothing to move).
#include <catch2/catch.hpp>

#include <cmath>

#include "amp/dist/communicator.h"
#include "amp/dist/shard_plan.h"
#include "engine/backend.h"

using namespace belay;

TEST_CASE("shard plan: largest first, each to the least loaded rank", "[dist][shard]") {
  // A GPT-like list: one large embedding, equal blocks, small vectors.
  const std::vector<int64_t> numels{1000, 10, 300, 300, 10, 300, 300, 10};
  const ShardPlan p = plan_shards(numels, 2);
  // 1000 to rank 0; the four 300s to rank 1 (900 < 1000 still takes the fourth); the 10s to rank 0.
  CHECK(p.owner == std::vector<int>{0, 0, 1, 1, 0, 1, 1, 0});
  CHECK(p.rank_numel == std::vector<int64_t>{1030, 1200});
  CHECK(plan_shards(numels, 2).owner == p.owner);  // deterministic
  CHECK(p.text() == "2:0,0,1,1,0,1,1,0");
}

TEST_CASE("shard plan: more ranks than tensors leaves ranks empty, one rank owns all", "[dist][shard]") {
  const ShardPlan four = plan_shards({5, 7}, 4);
  CHECK(four.owner == std::vector<int>{1, 0});
  CHECK(four.rank_numel == std::vector<int64_t>{7, 5, 0, 0});
  const ShardPlan one = plan_shards({5, 7, 9}, 1);
  CHECK(one.owner == std::vector<int>{0, 0, 0});
  CHECK_THROWS(plan_shards({1}, 0));
}

TEST_CASE("agree_on_partials: the guard's norm from per-tensor sums, non-finite from any rank", "[dist][shard]") {
  // One rank: the partials of what it owns, added in order: the guard's own formula.
  LocalCommunicator comm;
  comm.set_shards(plan_shards({3, 4}, 1));
  Tensor found = Tensor::zeros(Shape{1}, DType::F32, Device::cpu());
  Tensor loss_flag = Tensor::zeros(Shape{1}, DType::F32, Device::cpu());
  Tensor norm = Tensor::zeros(Shape{1}, DType::F32, Device::cpu());
  const Tensor a = Tensor::from_vector({1.0f, 2.0f, 2.0f}, Shape{3}, DType::F32, Device::cpu());
  const Tensor b = Tensor::from_vector({0.5f, 0.25f, 3.0f, 1e-3f}, Shape{4}, DType::F32, Device::cpu());
  const Tensor one = Tensor::scalar(1.0f, DType::F32, Device::cpu());
  std::vector<double> partials;
  const Backend& be = backend_for(Device::cpu());
  be.guard_partials({&a, &b}, one, partials);
  comm.agree_on_partials(partials, {true, true}, found, loss_flag, norm);
  Tensor guard_found = Tensor::zeros(Shape{1}, DType::F32, Device::cpu());
  Tensor guard_norm = Tensor::zeros(Shape{1}, DType::F32, Device::cpu());
  be.guard({&a, &b}, one, guard_found, guard_norm);
  CHECK(norm.item() == guard_norm.item());  // bit for bit
  CHECK(found.item() == 0.0f);
  // A tensor this rank does not own counts only when non-finite.
  comm.agree_on_partials({partials[0], partials[1]}, {true, false}, found, loss_flag, norm);
  CHECK(norm.item() == static_cast<float>(std::sqrt(partials[0])));
  comm.agree_on_partials({partials[0], INFINITY}, {true, false}, found, loss_flag, norm);
  CHECK(found.item() == 1.0f);
  CHECK(std::isinf(norm.item()));
}
