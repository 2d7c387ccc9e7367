#include "apps/run/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "engine/text_fields.h"

namespace belay {
namespace {

// The synthetic data, version 2. Its cost is what matters: a teacher as wide as the
// student (y = x W^T with W [out][in]) costs one GEMM for the step's three, and in double
// it took two thirds of a Linear(4096) step on the CPU. So:
//  - the teacher has rank 16: y = U (V x) + b, V [16][in] * 1/sqrt(in), U [out][16] * 0.25,
//    b * 0.1, drawn from stream 2 seed + 2 in that order. The student (a full Linear) has
//    the same task as before, fit a linear map, and the best possible MSE is still 1e-4; a
//    row costs 16 (in + out) multiply-adds instead of in * out.
//  - x and the noise are counter-based: the values of row n are a function of (key, n)
//    alone, two unit-variance uniforms per splitmix64 word. Any row can be drawn on its own,
//    by any thread, with the same bits; the position is the count of rows drawn.
//  - h = V x is summed in double in index order and rounded to FP32; y = b + the sum over
//    k in order, in double, of h_k U_ok, rounded to FP32, plus 0.01 * noise in FP32. Every
//    product of the sums is of two floats, exact in double, and this file is compiled with
//    -ffp-contract=off (CMakeLists.txt), so the noise's multiply and add are never fused:
//    the same bits on every ISA path.
// Version 1 (a full-rank teacher, xoshiro normals) is refused on resume: its position is
// 64 hex digits (set_position says so).
constexpr int64_t kRank = 16;
constexpr float kNoise = 0.01f;
constexpr int64_t kOutBlock = 16;  // outputs summed side by side: 16 chains of adds in flight
constexpr const char* kPositionPrefix = "synthetic.v2 rows ";

// The teacher, and the keys of the two counter-based streams.
struct Teacher {
  int64_t in, out, padded_out;  // padded_out: out rounded up to kOutBlock
  uint64_t x_key, noise_key;
  std::vector<float> vt;        // V^T [in][16]
  std::vector<float> ut, bias;  // U^T [16][padded_out] and b [padded_out], zeros past out
};

// Values j of row n, for j in [0, count): a unit-variance uniform from 24 random bits each,
// (2k + 1 - 2^24) / 2^24 * sqrt(3) (the first factor is exact in FP32: odd multiples of
// 2^-24 in (-1, 1), symmetric about 0). Word w = mix64(key + (n * words + w) * golden) gives
// values 2w (its top 24 bits) and 2w + 1 (the next 24).
[[gnu::always_inline]] inline float unit_uniform_of(uint64_t k24) {
  return static_cast<float>(2 * static_cast<int32_t>(k24) + 1 - (1 << 24)) * 0x1.0p-24f * 1.7320508f;
}
[[gnu::always_inline]] inline void unit_uniforms(uint64_t key, int64_t n, int64_t count, float* out) {
  const int64_t words = (count + 1) / 2, base = n * words;
  for (int64_t w = 0; w < count / 2; ++w) {  // the whole words
    const uint64_t bits = mix64(key + static_cast<uint64_t>(base + w) * 0x9e3779b97f4a7c15ull);
    out[2 * w] = unit_uniform_of(bits >> 40);
    out[2 * w + 1] = unit_uniform_of((bits >> 16) & 0xffffff);
  }
  if (count % 2) out[count - 1] = unit_uniform_of(mix64(key + static_cast<uint64_t>(base + words - 1) * 0x9e3779b97f4a7c15ull) >> 40);
}

// Row n of the data: x (in values) and y (out values). Inlined into one copy per ISA below,
// each compiled for it by a target attribute (the rest of apps/ is baseline x86-64) and
// chosen at run time with the kernels' path: every product is exact in double and every
// sum runs in index order, so each copy gives the same bits.
[[gnu::always_inline]] inline void teacher_row_body(const Teacher& t, int64_t n, float* x, float* y) {
  unit_uniforms(t.x_key, n, t.in, x);
  double h[kRank] = {};
  for (int64_t i = 0; i < t.in; ++i) {  // h_k = sum over i in order, the 16 side by side
    const double xi = x[i];
    const float* v = t.vt.data() + i * kRank;
#pragma GCC unroll 16
    for (int64_t k = 0; k < kRank; ++k) h[k] += xi * (double)v[k];
  }
  double hf[kRank];
  for (int64_t k = 0; k < kRank; ++k) hf[k] = static_cast<float>(h[k]);
  unit_uniforms(t.noise_key, n, t.out, y);  // the noise first, then y over it
  for (int64_t o0 = 0; o0 < t.out; o0 += kOutBlock) {
    double acc[kOutBlock];  // y_o = b_o + sum over k in order, a block of outputs side by side
    for (int64_t j = 0; j < kOutBlock; ++j) acc[j] = t.bias[o0 + j];
#pragma GCC unroll 16
    for (int64_t k = 0; k < kRank; ++k) {
      const float* u = t.ut.data() + k * t.padded_out + o0;
#pragma GCC unroll 16
      for (int64_t j = 0; j < kOutBlock; ++j) acc[j] += hf[k] * (double)u[j];
    }
    for (int64_t j = 0; j < std::min(kOutBlock, t.out - o0); ++j) y[o0 + j] = static_cast<float>(acc[j]) + kNoise * y[o0 + j];
  }
}
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void teacher_row_avx512(const Teacher& t, int64_t n, float* x, float* y) {
  teacher_row_body(t, n, x, y);
}
__attribute__((target("avx2,fma"))) void teacher_row_avx2(const Teacher& t, int64_t n, float* x, float* y) {
  teacher_row_body(t, n, x, y);
}
#endif
void teacher_row_baseline(const Teacher& t, int64_t n, float* x, float* y) { teacher_row_body(t, n, x, y); }

// The copy for the CPU kernels' path in use (BELAY_CPU_ISA / --cpu-isa lower it as they do
// the kernels; the bits are the same whichever runs).
using TeacherRow = void (*)(const Teacher&, int64_t, float*, float*);
TeacherRow teacher_row_for_active_isa() {
#if defined(__x86_64__)
  const std::string isa = active_cpu_isa_name();
  if (isa == "baseline") return teacher_row_baseline;
  if (isa == "avx2") return teacher_row_avx2;
  return teacher_row_avx512;  // avx512 and every path above it
#else
  return teacher_row_baseline;
#endif
}

class SyntheticRegression final : public Dataset {
 public:
  SyntheticRegression(int64_t in, int64_t out, uint64_t seed) {
    t_.in = in;
    t_.out = out;
    t_.padded_out = (out + kOutBlock - 1) / kOutBlock * kOutBlock;
    t_.x_key = stream_seed(seed, 0x78 /* 'x' */);
    t_.noise_key = stream_seed(seed, 0x6e /* 'n' */);
    // Drawn as V [16][in], then U [out][16], then b (the stream's order); kept transposed,
    // so the sums a loop runs side by side are adjacent in memory.
    Rng teacher(seed * 2 + 2);
    t_.vt.resize(static_cast<size_t>(in * kRank));
    t_.ut.assign(static_cast<size_t>(kRank * t_.padded_out), 0.0f);
    t_.bias.assign(static_cast<size_t>(t_.padded_out), 0.0f);
    const float sv = 1.0f / std::sqrt(static_cast<float>(in));
    for (int64_t k = 0; k < kRank; ++k)
      for (int64_t i = 0; i < in; ++i) t_.vt[static_cast<size_t>(i * kRank + k)] = sv * teacher.normal();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < kRank; ++k) t_.ut[static_cast<size_t>(k * t_.padded_out + o)] = 0.25f * teacher.normal();
    for (int64_t o = 0; o < out; ++o) t_.bias[static_cast<size_t>(o)] = 0.1f * teacher.normal();
  }

  Batch next(int64_t batch, Device device) override {
    Batch b{Tensor::empty(Shape{batch, t_.in}), Tensor::empty(Shape{batch, t_.out})};
    float* x = b.x.data_as<float>();
    float* y = b.y.data_as<float>();
    const TeacherRow row = teacher_row_for_active_isa();
    // Rows are independent: threads take them in blocks, each row's bits its own.
#pragma omp parallel for schedule(static) if (batch * (t_.in + t_.out) > (1 << 16))
    for (int64_t r = 0; r < batch; ++r) row(t_, rows_drawn_ + r, x + r * t_.in, y + r * t_.out);
    rows_drawn_ += batch;
    if (!device.is_cpu()) b = {b.x.to(device), b.y.to(device)};
    return b;
  }

  int64_t in_features() const override { return t_.in; }
  int64_t out_features() const override { return t_.out; }
  bool classification() const override { return false; }
  std::string position() const override { return kPositionPrefix + std::to_string(rows_drawn_); }
  void set_position(const std::string& p) override {
    const std::string prefix = kPositionPrefix;
    if (p.size() == 64 && p.find_first_not_of("0123456789abcdef") == std::string::npos)
      throw UsageError("this checkpoint's synthetic data came from belay's first data generator, which this belay "
                       "no longer has (its batches cannot be continued): resume it with the belay that wrote it, "
                       "or start a new run");
    const std::optional<int64_t> count = p.rfind(prefix, 0) == 0 ? parse_count(p.substr(prefix.size())) : std::nullopt;
    if (!count) throw UsageError("synthetic data position '" + p + "' is not '" + prefix + "N'");
    rows_drawn_ = *count;
  }
  std::string describe() const override { return "synthetic regression"; }

 private:
  Teacher t_;
  int64_t rows_drawn_ = 0;  // the position: rows n < this have been drawn
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
    Batch b{x_.copy_rows(pos_, pos_ + batch), y_.copy_rows(pos_, pos_ + batch)};
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
    const std::optional<int64_t> at = parse_count(p);
    if (!at || *at > rows_)
      throw UsageError("data position '" + p + "' does not fit '" + path_ + "' (" + std::to_string(rows_) + " rows)");
    pos_ = *at;
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
