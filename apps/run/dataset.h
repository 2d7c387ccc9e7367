// Where training batches come from: seeded synthetic regression data, or the user's
// safetensors file (--data). A dataset's position (what the next batch will be) is a
// string a checkpoint stores, so a resumed run sees exactly the batches it would have.
#pragma once
#include <memory>
#include <string>

#include "engine/random.h"
#include "engine/tensor.h"

namespace belay {

struct Batch {
  Tensor x;  // [B, in] FP32/FP16/BF16; tokens (apps/run/token_dataset.h): [B, T] ids held as FP32
  Tensor y;  // regression: [B, out]; classification: [B] class indices held as FP32; tokens: [B, T] next ids
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual Batch next(int64_t batch, Device device) = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;  // outputs, or classes
  virtual bool classification() const = 0;
  virtual std::string position() const = 0;
  virtual void set_position(const std::string& position) = 0;  // throws UsageError if malformed
  virtual std::string describe() const = 0;
  // The row of the data the last batch began at (a file's row), or -1 (synthetic data).
  virtual int64_t last_batch_first_row() const { return -1; }
};

// Synthetic regression (version 2, apps/run/dataset.cpp): x uniform with unit variance,
// y = U (V x) + b + 0.01 * noise with a fixed random teacher of rank 16 drawn from the
// seed; the best possible MSE is therefore 1e-4. Cheap by design: a row costs 16 (in + out)
// multiply-adds, and any row can be drawn on its own (its position: rows drawn).
std::unique_ptr<Dataset> make_synthetic_regression(int64_t in_features, int64_t out_features, uint64_t seed);

// Tensors `x` [N, in] (f32, f16 or bf16) and `y`: [N, out] floats (regression) or [N] I64
// class labels (classification). Batches are taken in order and wrap around. Errors name
// the file, the missing tensor, the wrong shape, or the first non-finite value of x and y;
// with allow_nonfinite (anomaly mode) such rows are kept, so the run meets them and says
// at which step and row.
std::unique_ptr<Dataset> load_dataset(const std::string& path, bool allow_nonfinite = false);

// The same over tensors already in memory (x [N, in] FP32; y [N, out] FP32, or [N] class
// indices held as FP32 with `classes` classes): `belay validate --train` trains on its set.
std::unique_ptr<Dataset> make_tensor_dataset(Tensor x, Tensor y, bool classification, int64_t classes,
                                             const std::string& name);

}  // namespace belay
