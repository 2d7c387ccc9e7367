#include "apps/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/safetensors.h"

namespace belay {
namespace {

// The teacher's outputs for rows [r0, r0 + rows) (rows <= Rows) and the Out outputs from o:
// clean[r][o + k] = bias[o + k] + the sum over i in index order, in double, of
// x[r][i] * W^T[i][o + k]. Each product of two floats is exact in double, so a fused
// multiply-add rounds exactly as a multiply and an add: the same bits at every width and
// tile shape. Inlined into one copy per ISA below, each compiled for it by a target attribute
// (the rest of apps/ is baseline x86-64), and chosen at run time with the kernels' path.
// Rows x Out accumulators: enough independent chains of adds to cover the FMA latency on
// both ports (AVX-512: 8 x 16 doubles = 16 zmm; 4 x 8 = 4 zmm measured 0.75 s per
// Linear(4096) batch, latency-bound), few enough to stay in registers (AVX2, SSE2: 4 x 8).
struct TeacherTile {
  const float* x;      // [batch][in]
  const float* wt;     // [in][out]
  const float* bias;   // [out]
  double* clean;       // [batch][out]
  int64_t in, out, r0, rows, o;
};
template <int64_t Rows, int64_t Out>
[[gnu::always_inline]] inline void teacher_tile_body(const TeacherTile& t) {
  // Rows past t.rows read the last real row again: computed, never stored (no branch inside).
  const float* xr[Rows];
  for (int64_t r = 0; r < Rows; ++r) xr[r] = t.x + (t.r0 + std::min(r, t.rows - 1)) * t.in;
  double acc[Rows][Out];
  for (int64_t r = 0; r < Rows; ++r)
    for (int64_t k = 0; k < Out; ++k) acc[r][k] = t.bias[t.o + k];
  for (int64_t i = 0; i < t.in; ++i) {
    const float* w = t.wt + i * t.out + t.o;
#pragma GCC unroll 8
    for (int64_t r = 0; r < Rows; ++r) {
      const double xi = xr[r][i];
#pragma GCC unroll 16
      for (int64_t k = 0; k < Out; ++k) acc[r][k] += xi * (double)w[k];
    }
  }
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t k = 0; k < Out; ++k) t.clean[(t.r0 + r) * t.out + t.o + k] = acc[r][k];
}
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void teacher_tile_avx512(const TeacherTile& t) { teacher_tile_body<8, 16>(t); }
__attribute__((target("avx2,fma"))) void teacher_tile_avx2(const TeacherTile& t) { teacher_tile_body<4, 8>(t); }
#endif
void teacher_tile_baseline(const TeacherTile& t) { teacher_tile_body<4, 8>(t); }

struct TeacherKernel {
  void (*tile)(const TeacherTile&);
  int64_t rows, out;  // the tile's shape
};
// The copy for the CPU kernels' path in use (BELAY_CPU_ISA / --cpu-isa lower it as they do
// the kernels; the bits are the same whichever runs).
TeacherKernel teacher_kernel_for_active_isa() {
#if defined(__x86_64__)
  const std::string isa = active_cpu_isa_name();
  if (isa == "baseline") return {teacher_tile_baseline, 4, 8};
  if (isa == "avx2") return {teacher_tile_avx2, 4, 8};
  return {teacher_tile_avx512, 8, 16};  // avx512 and every path above it
#else
  return {teacher_tile_baseline, 4, 8};
#endif
}

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
    // the same bits as a plain loop's whatever the blocking. A tile of adjacent outputs of a
    // few rows runs side by side (teacher_tile_body), and the threads take blocks of
    // outputs: a block's strip of W^T (in x 8 or 16 floats) stays in cache for every row, so
    // the teacher is read from memory once per batch, not once per row. The noise is drawn
    // after, in (row, output) order, from the one stream.
    std::vector<double> clean(y.size());
    const TeacherKernel kernel = teacher_kernel_for_active_isa();
    const int64_t out_blocks = (out_ + kernel.out - 1) / kernel.out;
#pragma omp parallel for schedule(static) if (batch * out_ * in_ > (1 << 20))
    for (int64_t ob = 0; ob < out_blocks; ++ob) {
      const int64_t o = ob * kernel.out;
      if (o + kernel.out > out_) {  // the last few outputs, one by one
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t oo = o; oo < out_; ++oo) {
            double acc = teacher_b_[oo];
            for (int64_t i = 0; i < in_; ++i) acc += (double)x[r * in_ + i] * teacher_wt_[i * out_ + oo];
            clean[r * out_ + oo] = acc;
          }
        continue;
      }
      for (int64_t r0 = 0; r0 < batch; r0 += kernel.rows)
        kernel.tile(TeacherTile{x.data(), teacher_wt_.data(), teacher_b_.data(), clean.data(), in_, out_, r0,
                                std::min(kernel.rows, batch - r0), o});
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
    read_x(f, allow_nonfinite);
    if (f.entry("y").dtype == "I64")
      read_labels(f);
    else
      read_targets(f, allow_nonfinite);
    in_ = f.entry("x").shape[1];
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
  // x [N, in], F32/F16/BF16, held in FP32.
  void read_x(const SafetensorsFile& f, bool allow_nonfinite) {
    const SafetensorsEntry& ex = f.entry("x");
    if (ex.shape.size() != 2 || ex.shape[0] < 1 || ex.shape[1] < 1)
      throw UsageError("data file '" + path_ + "': x must be [N, in] with N, in >= 1");
    if (ex.dtype != "F32" && ex.dtype != "F16" && ex.dtype != "BF16")
      throw UsageError("data file '" + path_ + "': x has dtype " + ex.dtype + "; use F32, F16 or BF16");
    x_ = f.tensor("x").to(DType::F32);  // exact; autocast rounds it to the compute dtype
    rows_ = ex.shape[0];
    // The first non-finite value of x, with its row: training on it would only produce NaN.
    const std::vector<float> xv = x_.to_vector();
    for (size_t i = 0; i < xv.size() && !allow_nonfinite; ++i)
      if (!std::isfinite(xv[i]))
        throw UsageError("data file '" + path_ + "': x has a non-finite value (" + std::to_string(xv[i]) + ") at row " +
                         std::to_string(i / ex.shape[1]) + ", column " + std::to_string(i % ex.shape[1]));
  }

  // y as I64 class labels [N]: classification, as many classes as the largest label + 1.
  void read_labels(const SafetensorsFile& f) {
    const SafetensorsEntry& ey = f.entry("y");
    if (ey.shape.size() != 1 || ey.shape[0] != rows_)
      throw UsageError("data file '" + path_ + "': class labels y must be [" + std::to_string(rows_) + "]");
    const std::vector<int64_t> labels = f.int64s("y");
    int64_t max_label = 0;
    std::vector<float> lf(labels.size());
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] < 0 || labels[i] >= (int64_t{1} << 24))
        throw UsageError("data file '" + path_ + "': label " + std::to_string(labels[i]) + " at row " +
                         std::to_string(i) + " is not a class index in [0, 2^24)");
      max_label = std::max(max_label, labels[i]);
      lf[i] = static_cast<float>(labels[i]);
    }
    y_ = Tensor::from_vector(lf, Shape{rows_});
    out_ = max_label + 1;
    classification_ = true;
  }

  // y as regression targets [N, out], F32/F16/BF16, held in FP32.
  void read_targets(const SafetensorsFile& f, bool allow_nonfinite) {
    const SafetensorsEntry& ey = f.entry("y");
    if (ey.dtype != "F32" && ey.dtype != "F16" && ey.dtype != "BF16")
      throw UsageError("data file '" + path_ + "': y has dtype " + ey.dtype + "; use F32/F16/BF16 or I64 labels");
    if (ey.shape.size() != 2 || ey.shape[0] != rows_ || ey.shape[1] < 1)
      throw UsageError("data file '" + path_ + "': y must be [" + std::to_string(rows_) + ", out] to match x");
    y_ = f.tensor("y").to(DType::F32);
    out_ = ey.shape[1];
    const std::vector<float> yv = y_.to_vector();
    for (size_t i = 0; i < yv.size() && !allow_nonfinite; ++i)
      if (!std::isfinite(yv[i]))
        throw UsageError("data file '" + path_ + "': y has a non-finite value at row " + std::to_string(i / out_));
  }

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
