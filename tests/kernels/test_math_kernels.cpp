// The CPU backend's ops behind the Var operators against FP64 (tests/kernels/math_ops_check.h,
// which tests/gpu/test_cuda_math.cpp runs on the CUDA backend too), and the property the ISA
// dispatch owes them: every vector path gives the same bits (the ops have one code path).
// Then the transformer's ops (embedding, LayerNorm, forward and backward) against FP64
// (tests/kernels/transformer_ops_check.h), and the determinism they owe: the same bits at any
// thread count (the embedding's backward with repeated ids, LayerNorm's dweight and dbias) and
// on every ISA path (LayerNorm's rows are per-ISA code).
#include <catch2/catch.hpp>
#include <omp.h>

#include <string>

#include "engine/backend.h"
#include "tests/kernels/math_ops_check.h"
#include "tests/kernels/transformer_ops_check.h"

using namespace belay;
using namespace belay::test::math;

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
  const std::string active = active_cpu_isa_name();
  const std::vector<float> xv = values(2000, 41, DType::F32, -3.0f, 3.0f);
  auto run = [&] {
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
  };
  const std::vector<uint32_t> baseline = [&] {
    select_cpu_isa("baseline");
    return run();
  }();
  for (const char* isa : {"avx2", "avx512"}) {
    try {
      select_cpu_isa(isa);
    } catch (const Error&) {
      continue;  // this CPU lacks the path
    }
    INFO(isa);
    CHECK(run() == baseline);
  }
  select_cpu_isa(active);
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
  const std::string active = active_cpu_isa_name();
  auto run = [] {
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
  };
  select_cpu_isa("baseline");
  const std::vector<uint32_t> baseline = run();
  for (const char* isa : {"avx2", "avx512"}) {
    try {
      select_cpu_isa(isa);
    } catch (const Error&) {
      continue;  // this CPU lacks the path
    }
    INFO(isa);
    CHECK(run() == baseline);
  }
  select_cpu_isa(active);
}
