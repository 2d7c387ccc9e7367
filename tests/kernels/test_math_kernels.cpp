// The CPU backend's ops behind the Var operators against FP64 (tests/kernels/math_ops_check.h,
// which tests/gpu/test_cuda_math.cpp runs on the CUDA backend too), and the property the ISA
// dispatch owes them: every vector path gives the same bits (the ops have one code path).
// Then the transformer's ops (embedding, LayerNorm, forward and backward) against FP64
// (tests/kernels/transformer_ops_check.h), and the determinism they owe: the same bits at any
// thread count (the embedding's backward with repeated ids, LayerNorm's dweight and dbias) and
// on every ISA path (LayerNorm's and softmax's rows are per-ISA code), at odd widths too.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <functional>
#include <string>

#include "engine/backend.h"
#include "tests/kernels/math_ops_check.h"
#include "tests/kernels/transformer_ops_check.h"

using namespace belay;
using namespace belay::test::math;

namespace {
// The property the ISA dispatch owes every op: run() (the op's results as bits) gives the
// baseline path's bits on every other path this CPU has. A path it lacks is skipped (an
// AVX2 machine runs baseline and avx2); the active path is put back afterwards.
// How many elements of got differ from want (a size mismatch counts as all): a count, so a
// failure prints one number, not two vectors of a hundred thousand elements.
int64_t bits_differing(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want) {
  if (got.size() != want.size()) return static_cast<int64_t>(std::max(got.size(), want.size()));
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += got[i] != want[i];
  return n;
}

void check_same_bits_on_every_isa(const std::function<std::vector<uint32_t>()>& run) {
  const std::string active = active_cpu_isa_name();
  select_cpu_isa("baseline");
  const std::vector<uint32_t> baseline = run();
  for (const char* isa : {"avx2", "avx512"}) {
    try {
      select_cpu_isa(isa);
    } catch (const Error&) {
      continue;  // this CPU lacks the path
    }
    INFO(isa);
    CHECK(bits_differing(run(), baseline) == 0);
  }
  select_cpu_isa(active);
}
}  // namespace

TEST_CASE("cpu unary ops (exp, log, tanh, sigmoid, pow) and their backward match FP64", "[kernels][math]") {
  check_unary(Device::cpu());
}

TEST_CASE("cpu binary_broadcast, broadcast_axis and sum_axis match FP64", "[kernels][math]") {
  check_broadcast(Device::cpu());
}

TEST_CASE("cpu softmax and log_softmax (plain and causal) and their backward match FP64", "[kernels][math]") {
  check_softmax(Device::cpu());
}

TEST_CASE("cpu transpose copies every bit", "[kernels][math]") { check_transpose(Device::cpu()); }

TEST_CASE("cpu math ops give the same bits on every ISA path", "[kernels][math]") {
  const std::vector<float> xv = values(2000, 41, DType::F32, -3.0f, 3.0f);
  check_same_bits_on_every_isa([&] {
    const Backend& be = backend_for(Device::cpu());
    Tensor x = Tensor::from_vector(xv, Shape{40, 50}, DType::F16);
    Tensor y = Tensor::empty(x.shape(), DType::F16), s = Tensor::empty(x.shape(), DType::F16);
    Tensor r = Tensor::empty(Shape{40}, DType::F32);
    be.unary(UnaryOp::Tanh, 0.0f, x, y);
    be.softmax(x, 50, false, false, s);
    be.sum_axis(x, AxisView{40, 50, 1}, 1.0f, r, false);
    std::vector<float> all = y.to_vector(), sv = s.to_vector(), rv = r.to_vector();
    all.insert(all.end(), sv.begin(), sv.end());
    all.insert(all.end(), rv.begin(), rv.end());
    return test::bits_of(all);
  });
}

TEST_CASE("cpu embedding copies rows, its backward adds them in FP32, bad ids are errors", "[kernels][transformer]") {
  test::transformer::check_embedding(Device::cpu());
  test::transformer::check_embedding_bad_ids(Device::cpu());
}

TEST_CASE("cpu layer_norm and its backward (dx, dweight, dbias) match FP64", "[kernels][transformer]") {
  test::transformer::check_layer_norm(Device::cpu());
}

namespace {
using namespace belay::test::transformer;
// The embedding backward of 4096 rows onto 7 table rows (every id repeated ~585 times) and
// LayerNorm's backward over 2048 rows: large enough to run on every thread, as bits.
std::vector<uint32_t> transformer_grads() {
  const Backend& be = backend_for(Device::cpu());
  const int64_t n = 4096, dim = 24, vocab = 7;
  const Tensor ids = Tensor::from_vector(repeated_ids(n, vocab), Shape{n});
  const Tensor g = Tensor::from_vector(values(n * dim, 71, DType::BF16), Shape{n, dim}, DType::BF16);
  Tensor dtable = Tensor::from_vector(values(vocab * dim, 72, DType::F32), Shape{vocab, dim});
  be.embedding_backward(g, ids, dtable);
  const int64_t rows = 2048, cols = 40;
  const Tensor x = Tensor::from_vector(values(rows * cols, 73, DType::F32), Shape{rows, cols});
  const Tensor dy = Tensor::from_vector(values(rows * cols, 74, DType::F32), Shape{rows, cols});
  const Tensor w = Tensor::from_vector(values(cols, 75, DType::F32, 0.5f, 1.5f), Shape{cols});
  Tensor y = Tensor::empty(x.shape(), DType::F32), dx = Tensor::empty(x.shape(), DType::F32);
  Tensor mean = Tensor::empty(Shape{rows}, DType::F32), rstd = Tensor::empty(Shape{rows}, DType::F32);
  Tensor dw = Tensor::zeros(Shape{cols}, DType::F32), db = Tensor::zeros(Shape{cols}, DType::F32);
  be.layer_norm(x, &w, &w, 1e-5f, y, mean, rstd);
  be.layer_norm_backward(x, &w, mean, rstd, dy, dx, &dw, &db, false);
  std::vector<float> all = dtable.to_vector();
  for (const Tensor* t : {&y, &mean, &rstd, &dx, &dw, &db}) {
    const std::vector<float> v = t->to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return test::bits_of(all);
}
}  // namespace

TEST_CASE("cpu embedding backward (repeated ids) and layer_norm give the same bits at any thread count",
          "[kernels][transformer]") {
  // The spec of the embedding backward: the bits of the sequential loop, row by row in order.
  const int64_t n = 4096, dim = 24, vocab = 7;
  const std::vector<float> idv = test::transformer::repeated_ids(n, vocab), gv = values(n * dim, 71, DType::BF16);
  std::vector<float> seq = values(vocab * dim, 72, DType::F32);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < dim; ++c) seq[static_cast<size_t>(idv[r]) * dim + c] += gv[r * dim + c];
  const int threads = omp_get_max_threads();
  const std::vector<uint32_t> base = transformer_grads();
  const std::vector<uint32_t> want(test::bits_of(seq));
  CHECK(std::vector<uint32_t>(base.begin(), base.begin() + vocab * dim) == want);
  for (int t : {1, 3}) {
    INFO("threads " << t << " vs " << threads);
    omp_set_num_threads(t);
    const std::vector<uint32_t> bits = transformer_grads();
    omp_set_num_threads(threads);
    CHECK(bits == base);
  }
}

TEST_CASE("cpu layer_norm gives the same bits on every ISA path", "[kernels][transformer]") {
  check_same_bits_on_every_isa([] {
    const Backend& be = backend_for(Device::cpu());
    std::vector<float> all;
    for (DType dt : kMathDtypes) {
      const int64_t rows = 9, cols = 77;  // 4 x 16 lanes + 13
      const Tensor x = Tensor::from_vector(values(rows * cols, 81, dt, -3.0f, 5.0f), Shape{rows, cols}, dt);
      const Tensor dy = Tensor::from_vector(values(rows * cols, 82, dt), Shape{rows, cols}, dt);
      const Tensor w = Tensor::from_vector(values(cols, 83, DType::F32, 0.5f, 1.5f), Shape{cols});
      Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
      Tensor mean = Tensor::empty(Shape{rows}, DType::F32), rstd = Tensor::empty(Shape{rows}, DType::F32);
      Tensor dw = Tensor::zeros(Shape{cols}, DType::F32), db = Tensor::zeros(Shape{cols}, DType::F32);
      be.layer_norm(x, &w, &w, 1e-5f, y, mean, rstd);
      be.layer_norm_backward(x, &w, mean, rstd, dy, dx, &dw, &db, true);
      for (const Tensor* t : {&y, &mean, &rstd, &dx, &dw, &db}) {
        const std::vector<float> v = t->to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
    }
    return test::bits_of(all);
  });
}

// The rows at widths that are not multiples of the 16 lanes (1, 7, 33, 768 + 3), against FP64.
TEST_CASE("cpu softmax and layer_norm rows of odd widths match FP64", "[kernels][transformer]") {
  check_softmax(Device::cpu(), {SoftmaxCase{3, 1, false}, SoftmaxCase{5, 7, true}, SoftmaxCase{4, 33, false},
                                SoftmaxCase{40, 33, true}, SoftmaxCase{3, 771, false}, SoftmaxCase{5, 771, true}});
  for (int64_t cols : {1, 7, 33, 771})
    for (DType dt : kMathDtypes) test::transformer::check_layer_norm_case(Device::cpu(), {5, cols, true}, dt, DType::F32);
}

namespace {
// Softmax and log-softmax (plain and causal), forward and backward, and LayerNorm forward and
// backward on rows of `cols`, in FP32 and BF16 (FP16 rows go through the same row kernels,
// widened the same way), as bits. Just over 2^15 elements: the backend splits the rows
// between threads.
std::vector<uint32_t> row_op_bits(int64_t cols) {
  const Backend& be = backend_for(Device::cpu());
  const int64_t rows = std::max<int64_t>(9, (1 << 15) / cols + 1), n = rows * cols;
  std::vector<float> all;
  auto keep = [&](const Tensor& t) {
    const std::vector<float> v = t.to_vector();
    all.insert(all.end(), v.begin(), v.end());
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = Tensor::from_vector(values(n, 91, dt, -6.0f, 6.0f), Shape{rows, cols}, dt);
    const Tensor dy = Tensor::from_vector(values(n, 92, dt), Shape{rows, cols}, dt);
    Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
    for (bool log : {false, true})
      for (bool causal : {false, true}) {
        be.softmax(x, cols, log, causal, y);
        be.softmax_backward(y, dy, cols, log, causal, dx);
        keep(y);
        keep(dx);
      }
    const Tensor w = Tensor::from_vector(values(cols, 93, DType::F32, 0.5f, 1.5f), Shape{cols});
    Tensor mean = Tensor::empty(Shape{rows}, DType::F32), rstd = Tensor::empty(Shape{rows}, DType::F32);
    Tensor dw = Tensor::zeros(Shape{cols}, DType::F32), db = Tensor::zeros(Shape{cols}, DType::F32);
    be.layer_norm(x, &w, &w, 1e-5f, y, mean, rstd);
    be.layer_norm_backward(x, &w, mean, rstd, dy, dx, &dw, &db, false);
    for (const Tensor* t : {&y, &mean, &rstd, &dx, &dw, &db}) keep(*t);
  }
  return test::bits_of(all);
}
}  // namespace

TEST_CASE("cpu softmax and layer_norm rows give the baseline's bits on every ISA path at 1 and 2 threads",
          "[kernels][transformer]") {
  const int threads = omp_get_max_threads();
  for (int64_t cols : {1, 7, 33, 771}) {
    INFO("cols " << cols);
    // Every path against the baseline on one thread (the rows' kernels), then the active path
    // on two threads against the same bits (the backend's split of the rows).
    omp_set_num_threads(1);
    std::vector<uint32_t> want;
    check_same_bits_on_every_isa([&] {
      std::vector<uint32_t> bits = row_op_bits(cols);
      if (want.empty()) want = bits;  // the first run is the baseline's
      return bits;
    });
    omp_set_num_threads(2);
    CHECK(bits_differing(row_op_bits(cols), want) == 0);
    omp_set_num_threads(threads);
  }
}

TEST_CASE("cpu layer_norm_backward refuses a dweight or dbias that is not FP32 of the row width", "[kernels][transformer]") {
  // The check every backend runs (engine/backend_checks.cpp, checks::layer_norm_backward).
  const Backend& be = backend_for(Device::cpu());
  const int64_t rows = 3, cols = 8;
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 5) - 2.0f;
  const Tensor x = Tensor::from_vector(v, Shape{rows, cols});
  Tensor y = Tensor::empty(x.shape(), DType::F32, Device::cpu()), dx = Tensor::empty(x.shape(), DType::F32, Device::cpu());
  Tensor mean = Tensor::empty(Shape{rows}, DType::F32, Device::cpu()), rstd = Tensor::empty(Shape{rows}, DType::F32, Device::cpu());
  be.layer_norm(x, nullptr, nullptr, 1e-5f, y, mean, rstd);
  Tensor half_db = Tensor::zeros(Shape{cols}, DType::F16, Device::cpu());
  Tensor short_db = Tensor::zeros(Shape{cols - 1}, DType::F32, Device::cpu());
  for (Tensor* bad : {&half_db, &short_db})
    CHECK_THROWS_WITH(be.layer_norm_backward(x, nullptr, mean, rstd, x, dx, nullptr, bad, false),
                      Catch::Contains("dweight and dbias must be fp32 of 8 elements"));
  Tensor short_dx = Tensor::empty(Shape{rows, cols - 1}, DType::F32, Device::cpu());
  CHECK_THROWS_AS(be.layer_norm_backward(x, nullptr, mean, rstd, x, short_dx, nullptr, nullptr, false), Error);
}
