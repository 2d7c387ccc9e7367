// The bucket scheme of data parallelism without MPI: a stand-in transport for a world of two
// equal replicas (the all-reduce doubles each element, exactly as adding an equal peer does).
// Checks the layout, the order buckets start in, that the hook starts them during backward,
// and that any bucket size gives the flat all-reduce's bits. tests/dist/ runs real ranks.
#include <catch2/catch.hpp>


#include "amp/autocast.h"
#include "amp/dist/bucketed_communicator.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/backend.h"
#include "optim/adamw.h"
#include "tests/amp/master_bits.h"

using namespace belay;

namespace {

class TwinBuckets final : public BucketedCommunicator {
 public:
  std::vector<size_t> started;    // bucket indices, in the order they started
  std::vector<int64_t> numels;    // each started bucket's elements
  int world_size() const override { return 2; }
  int rank() const override { return 0; }
  std::string name() const override { return "twin"; }
  size_t bucket_count() const { return buckets_.size(); }

 protected:
  void start_bucket(size_t index, Bucket& bucket) override {
    started.push_back(index);
    int64_t n = 0;
    for (Tensor* g : bucket.grads) n += g->numel();
    numels.push_back(n);
  }
  void complete_buckets(std::vector<Bucket>& buckets) override {
    const Backend& be = backend_for(Device::cpu());
    for (Bucket& b : buckets)
      for (Tensor* g : b.grads) be.binary(BinaryOp::Add, *g, *g, *g);
  }
  size_t wire_bytes(const Tensor&) const override { return sizeof(float); }
};

// Reduces the same way without buckets (the seam's default path), for the flat reference.
class TwinFlat final : public Communicator {
 public:
  int world_size() const override { return 2; }
  int rank() const override { return 0; }
  std::string name() const override { return "twin-flat"; }
  void all_reduce_gradients(const std::vector<Tensor*>& grads) override {
    const Backend& be = backend_for(Device::cpu());
    for (Tensor* g : grads) be.binary(BinaryOp::Add, *g, *g, *g);
    ++gradient_syncs_;
  }
};

struct Run {
  Rng rng{7};
  Mlp model{16, 32, 4, rng, 4};  // weights 512, 1024, 1024, 128 elements; biases 32, 32, 32, 4
  AdamW opt{model.parameters()};
  GradScaler scaler{Device::cpu(), GradScalerOptions{}};
  SafeStep step;
  Tensor x = Tensor::full(Shape{8, 16}, 0.125f), y = Tensor::full(Shape{8, 4}, 1.0f);
  Run(Communicator* comm, int accum)
      : step(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{1.0f, accum, true}, comm) {
    model.set_working_dtype(DType::F16);
  }
  void steps(int n) {
    for (int i = 0; i < n; ++i)
      step.run([&](int k) {
        Autocast fp16(DType::F16);
        return mse_loss(model(Var(x.copy_rows(k * 4, k * 4 + 4))), y.copy_rows(k * 4, k * 4 + 4));
      });
  }
};

}  // namespace

TEST_CASE("buckets: the layout follows backward (last layer first) and the size", "[amp][dist]") {
  TwinBuckets comm;
  comm.set_bucket_bytes(1100 * sizeof(float));  // the 1024-element weights fill one each
  Run run(&comm, 2);
  run.steps(1);
  // Reverse order b3 4, w3 128, b2 32 | w2 1024, b1 32 | w1 1024, b0 32 | w0 512: a bucket
  // closes before the parameter that would take it past 1100 elements.
  CHECK(comm.bucket_count() == 4);
  CHECK(comm.numels == std::vector<int64_t>{164, 1056, 1056, 512});
  CHECK(comm.started == std::vector<size_t>{0, 1, 2, 3});
  CHECK(comm.gradient_syncs() == 1);  // one per effective step, not per micro-batch
  CHECK(comm.gradient_buckets() == 4);
  CHECK(comm.buckets_during_backward() == 4);  // the hook started every one before backward ended
  CHECK(comm.gradient_bytes() == 4 * (164 + 1056 + 1056 + 512));
}

TEST_CASE("buckets: any bucket size gives the flat all-reduce's bits", "[amp][dist]") {
  TwinFlat flat;
  Run reference(&flat, 2);
  reference.steps(3);
  for (size_t bytes : {size_t{0}, size_t{4}, size_t{600 * 4}, size_t{25} << 20}) {
    INFO("bucket bytes " << bytes);
    TwinBuckets comm;
    comm.set_bucket_bytes(bytes);
    Run run(&comm, 2);
    run.steps(3);
    CHECK(test::master_bits(run.model) == test::master_bits(reference.model));
    CHECK(comm.gradient_syncs() == 3);
  }
}

TEST_CASE("buckets: one bucket per parameter with a size of one byte", "[amp][dist]") {
  TwinBuckets comm;
  comm.set_bucket_bytes(1);
  Run run(&comm, 1);
  run.steps(1);
  CHECK(comm.bucket_count() == run.model.parameters().size());
}
