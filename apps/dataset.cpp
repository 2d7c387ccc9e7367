#include "apps/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/error.h"
#include "engine/safetensors.h"

namespace belay {
namespace {

class SyntheticRegression final : public Dataset {
 public:
  SyntheticRegression(int64_t in, int64_t out, uint64_t seed) : in_(in), out_(out), rng_(seed * 2 + 1) {
    Rng teacher(seed * 2 + 2);
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    // Drawn as W[out][in] (the stream's order), kept transposed: W^T[i][o], so the outputs
    // a loop runs side by side are adjacent in memory.
    teacher_wt_.resize(static_cast<size_t>(in * out));
    teacher_b_.resize(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) teacher_wt_[static_cast<size_t>(i * out + o)] = s * teacher.normal();
    for (float& b : teacher_b_) b = 0.1f * teacher.normal();
  }

  Batch next(int64_t batch, Device device) override {
    std::vector<float> x(static_cast<size_t>(batch * in_)), y(static_cast<size_t>(batch * out_));
    for (float& v : x) v = rng_.normal();
    // The teacher's outputs: each a sum over i in index order, in double, so the data are
    // the same bits as a plain loop's whatever the blocking. Eight adjacent outputs of four
    // rows run side by side (32 independent add chains), and the threads take blocks of
    // outputs: a block's strip of W^T (in x 8 floats) stays in cache for every row, so the
    // teacher is read from memory once per batch, not once per row. The noise is drawn
    // after, in (row, output) order, from the one stream.
    std::vector<double> clean(y.size());
    constexpr int64_t kOut = 8, kRows = 4;
    const int64_t out_blocks = (out_ + kOut - 1) / kOut;
#pragma omp parallel for schedule(static) if (batch * out_ * in_ > (1 << 20))
    for (int64_t ob = 0; ob < out_blocks; ++ob) {
      const int64_t o = ob * kOut;
      if (o + kOut > out_) {  // the last few outputs, one by one
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t oo = o; oo < out_; ++oo) {
            double acc = teacher_b_[oo];
            for (int64_t i = 0; i < in_; ++i) acc += (double)x[r * in_ + i] * teacher_wt_[i * out_ + oo];
            clean[r * out_ + oo] = acc;
          }
        continue;
      }
      for (int64_t r0 = 0; r0 < batch; r0 += kRows) {
        const int64_t rows = std::min(kRows, batch - r0);
        double acc[kRows][kOut];
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t k = 0; k < kOut; ++k) acc[r][k] = teacher_b_[o + k];
        for (int64_t i = 0; i < in_; ++i) {
          const float* w = teacher_wt_.data() + i * out_ + o;
          for (int64_t r = 0; r < kRows; ++r) {
            const double xi = r < rows ? (double)x[(r0 + r) * in_ + i] : 0.0;
            for (int64_t k = 0; k < kOut; ++k) acc[r][k] += xi * (double)w[k];
          }
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < kOut; ++k) clean[(r0 + r) * out_ + o + k] = acc[r][k];
      }
    }
    for (size_t j = 0; j < y.size(); ++j) y[j] = static_cast<float>(clean[j]) + 0.01f * rng_.normal();
    return {Tensor::from_vector(x, Shape{batch, in_}, DType::F32, device),
            Tensor::from_vector(y, Shape{batch, out_}, DType::F32, device)};
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  bool classification() const override { return false; }
  std::string position() const override { return rng_.state_hex(); }  // the shared stream's state
  void set_position(const std::string& p) override {
    if (!rng_.set_state_hex(p)) throw UsageError("synthetic data position '" + p + "' is not 64 hex digits");
  }
  std::string describe() const override { return "synthetic regression"; }

 private:
  int64_t in_, out_;
  std::vector<float> teacher_wt_, teacher_b_;  // the teacher's W^T [in][out] and bias
  Rng rng_;
};

class FileDataset final : public Dataset {
 public:
  FileDataset(Tensor x, Tensor y, bool classification, int64_t classes, const std::string& name)
      : path_(name), x_(std::move(x)), y_(std::move(y)), classification_(classification) {
    rows_ = x_.dim(0);
    in_ = x_.dim(1);
    out_ = classification ? classes : y_.dim(1);
  }

  FileDataset(const std::string& path, bool allow_nonfinite) : path_(path) {
    const SafetensorsFile f = read_safetensors(path);
    for (const char* name : {"x", "y"})
      if (!f.contains(name))
        throw UsageError("data file '" + path + "' has no tensor '" + name + "' (it needs x [N, in] and y)");
    const SafetensorsEntry& ex = f.entry("x");
    const SafetensorsEntry& ey = f.entry("y");
    if (ex.shape.size() != 2 || ex.shape[0] < 1 || ex.shape[1] < 1)
      throw UsageError("data file '" + path + "': x must be [N, in] with N, in >= 1");
    if (ex.dtype != "F32" && ex.dtype != "F16" && ex.dtype != "BF16")
      throw UsageError("data file '" + path + "': x has dtype " + ex.dtype + "; use F32, F16 or BF16");
    x_ = f.tensor("x").to(DType::F32);  // exact; autocast rounds it to the compute dtype
    rows_ = ex.shape[0];
    // The first non-finite value of x, with its row: training on it would only produce NaN.
    const std::vector<float> xv = x_.to_vector();
    for (size_t i = 0; i < xv.size() && !allow_nonfinite; ++i)
      if (!std::isfinite(xv[i]))
        throw UsageError("data file '" + path + "': x has a non-finite value (" + std::to_string(xv[i]) + ") at row " +
                         std::to_string(i / ex.shape[1]) + ", column " + std::to_string(i % ex.shape[1]));
    if (ey.dtype == "I64") {
      if (ey.shape.size() != 1 || ey.shape[0] != rows_)
        throw UsageError("data file '" + path + "': class labels y must be [" + std::to_string(rows_) + "]");
      const std::vector<int64_t> labels = f.int64s("y");
      int64_t max_label = 0;
      std::vector<float> lf(labels.size());
      for (size_t i = 0; i < labels.size(); ++i) {
        if (labels[i] < 0 || labels[i] >= (int64_t{1} << 24))
          throw UsageError("data file '" + path + "': label " + std::to_string(labels[i]) + " at row " +
                           std::to_string(i) + " is not a class index in [0, 2^24)");
        max_label = std::max(max_label, labels[i]);
        lf[i] = static_cast<float>(labels[i]);
      }
      y_ = Tensor::from_vector(lf, Shape{rows_});
      out_ = max_label + 1;
      classification_ = true;
    } else {
      if (ey.dtype != "F32" && ey.dtype != "F16" && ey.dtype != "BF16")
        throw UsageError("data file '" + path + "': y has dtype " + ey.dtype + "; use F32/F16/BF16 or I64 labels");
      if (ey.shape.size() != 2 || ey.shape[0] != rows_ || ey.shape[1] < 1)
        throw UsageError("data file '" + path + "': y must be [" + std::to_string(rows_) + ", out] to match x");
      y_ = f.tensor("y").to(DType::F32);
      out_ = ey.shape[1];
      const std::vector<float> yv = y_.to_vector();
      for (size_t i = 0; i < yv.size() && !allow_nonfinite; ++i)
        if (!std::isfinite(yv[i]))
          throw UsageError("data file '" + path + "': y has a non-finite value at row " + std::to_string(i / out_));
    }
    in_ = ex.shape[1];
  }

  Batch next(int64_t batch, Device device) override {
    if (batch > rows_)
      throw UsageError("data file '" + path_ + "' has " + std::to_string(rows_) + " rows, fewer than a batch of " +
                       std::to_string(batch));
    if (pos_ + batch > rows_) pos_ = 0;  // wrap around: the tail shorter than a batch is dropped
    Batch b{x_.slice_rows(pos_, pos_ + batch), y_.slice_rows(pos_, pos_ + batch)};
    last_first_row_ = pos_;
    pos_ += batch;
    if (!device.is_cpu()) b = {b.x.to(device), b.y.to(device)};
    return b;
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  bool classification() const override { return classification_; }
  std::string position() const override { return std::to_string(pos_); }
  int64_t last_batch_first_row() const override { return last_first_row_; }
  void set_position(const std::string& p) override {
    if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos || p.size() > 18 ||
        std::stoll(p) > rows_)
      throw UsageError("data position '" + p + "' does not fit '" + path_ + "' (" + std::to_string(rows_) + " rows)");
    pos_ = std::stoll(p);
  }
  std::string describe() const override {
    return "'" + path_ + "' (" + std::to_string(rows_) + " rows, " +
           (classification_ ? std::to_string(out_) + " classes" : "regression") + ")";
  }

 private:
  std::string path_;
  Tensor x_, y_;
  int64_t rows_ = 0, in_ = 0, out_ = 0, pos_ = 0, last_first_row_ = -1;
  bool classification_ = false;
};

}  // namespace

std::unique_ptr<Dataset> make_synthetic_regression(int64_t in, int64_t out, uint64_t seed) {
  return std::make_unique<SyntheticRegression>(in, out, seed);
}

std::unique_ptr<Dataset> load_dataset(const std::string& path, bool allow_nonfinite) {
  return std::make_unique<FileDataset>(path, allow_nonfinite);
}

std::unique_ptr<Dataset> make_tensor_dataset(Tensor x, Tensor y, bool classification, int64_t classes,
                                             const std::string& name) {
  return std::make_unique<FileDataset>(std::move(x), std::move(y), classification, classes, name);
}

}  // namespace belay
