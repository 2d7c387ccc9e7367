// Internal for now (only the single-process communicator exists).
// The seam where data parallelism plugs in: gradients are all-reduced once per effective
// step, after the last micro-batch (never per micro-batch). The single-process
// communicator does nothing but count the calls; MPI (CPU) and NCCL (GPU) implementations
// will average gradient buffers here.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace belay {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int world_size() const = 0;
  virtual int rank() const = 0;
  // Averages every gradient buffer across ranks, in place.
  virtual void all_reduce_gradients(const std::vector<Tensor*>& grads) = 0;
  int64_t gradient_syncs() const { return gradient_syncs_; }

 protected:
  int64_t gradient_syncs_ = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int world_size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce_gradients(const std::vector<Tensor*>&) override { ++gradient_syncs_; }
};

}  // namespace belay
