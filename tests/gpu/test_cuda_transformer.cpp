// The CUDA kernels of the transformer's ops (embedding_kernels.cu, layer_norm_kernels.cu)
// against the same FP64 references as the CPU backend (tests/kernels/transformer_ops_check.h),
// the embedding backward's bits against the CPU backend's (both owe the sequential loop's),
// bad ids as NaN rows, and the autograd ops end to end on the device. Shapes stay small: the
// emulator runs every thread as a fiber.
#include <cmath>

#include "autograd/ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/transformer_ops_check.h"

using namespace belay;
using namespace belay::test;

TEST_CASE("cuda embedding copies rows and its backward adds them in FP32 (FP64 reference)", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  transformer::check_embedding(Device::cuda());
}

TEST_CASE("cuda embedding backward gives the bits of the sequential loop as the CPU backend does", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  // 300 positions: more than one chunk of the bucketing block (256), so a row's occurrences
  // span two chunks; 7 rows, each id repeated ~43 times, where an add out of order shows.
  // Then one id into a table of one column.
  struct Case {
    int64_t n, vocab, dim;
  };
  for (const Case& k : {Case{300, 7, 33}, Case{1, 3, 1}}) {
    for (DType dt : math::kMathDtypes) {
      const int64_t n = k.n, vocab = k.vocab, dim = k.dim;
      INFO(name_of(dt) << ", " << n << " ids into " << vocab << " x " << dim);
      const std::vector<float> idv = transformer::repeated_ids(n, vocab);
      const Pair ids = make_pair(idv, Shape{n}, DType::F32);
      const std::vector<float> gv = math::values(n * dim, 81, dt), old = math::values(vocab * dim, 82, DType::F32);
      std::vector<float> seq = old;  // the contract: for r in order: dtable[ids[r]] += dout[r]
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < dim; ++c) seq[static_cast<size_t>(idv[r]) * dim + c] += gv[r * dim + c];
      const Pair g = make_pair(gv, Shape{n, dim}, dt);
      Pair dtable = make_pair(old, Shape{vocab, dim}, DType::F32);
      cpu().embedding_backward(g.host, ids.host, dtable.host);
      gpu().embedding_backward(g.device, ids.device, dtable.device);
      CHECK(bits_of(dtable.device.to(Device::cpu())) == bits_of(seq));
      CHECK(bits_of(dtable.host) == bits_of(seq));
    }
  }
}

TEST_CASE("cuda embedding turns an invalid id into a NaN row instead of a host check", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  const int64_t vocab = 11, dim = 5;
  const std::vector<float> idv{0.0f, 11.0f, -1.0f, 2.5f, NAN, 3.0f, 3.0f};
  const Tensor ids = Tensor::from_vector(idv, Shape{7}, DType::F32, Device::cuda());
  for (DType dt : math::kMathDtypes) {
    INFO(name_of(dt));
    const std::vector<float> tv = math::values(vocab * dim, 83, dt);
    Tensor out = Tensor::empty(Shape{7, dim}, dt, Device::cuda());
    gpu().embedding(math::make(tv, Shape{vocab, dim}, dt, Device::cuda()), ids, out);
    const std::vector<float> got = out.to(Device::cpu()).to_vector();
    for (int64_t r = 0; r < 7; ++r) {
      const bool bad = r >= 1 && r <= 4;
      INFO("position " << r);
      for (int64_t c = 0; c < dim; ++c) {
        if (bad) CHECK(std::isnan(got[r * dim + c]));
        else CHECK(f32_bits(got[r * dim + c]) == f32_bits(tv[static_cast<size_t>(idv[r]) * dim + c]));
      }
    }
  }
  // The backward leaves the bad positions out: the CPU's result from the good ones alone.
  const std::vector<float> gv = math::values(7 * dim, 84, DType::F32);
  Tensor dtable = Tensor::zeros(Shape{vocab, dim}, DType::F32, Device::cuda());
  gpu().embedding_backward(Tensor::from_vector(gv, Shape{7, dim}, DType::F32, Device::cuda()), ids, dtable);
  std::vector<float> want(static_cast<size_t>(vocab * dim), 0.0f);
  for (int64_t r : {0, 5, 6})
    for (int64_t c = 0; c < dim; ++c) want[static_cast<size_t>(idv[r]) * dim + c] += gv[r * dim + c];
  CHECK(bits_of(dtable.to(Device::cpu())) == bits_of(want));
}

TEST_CASE("cuda layer_norm and its backward match FP64 for dx and dweight and dbias", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  transformer::check_layer_norm(Device::cuda());
  // 70 rows: dweight and dbias summed over three chunks of rows (32 a chunk), then the chunks.
  transformer::check_layer_norm_case(Device::cuda(), transformer::NormCase{70, 20, true}, DType::F32, DType::F32);
  // One row; and a row longer than the block (257 columns: a thread takes two).
  transformer::check_layer_norm_case(Device::cuda(), transformer::NormCase{1, 37, true}, DType::F16, DType::F32);
  transformer::check_layer_norm_case(Device::cuda(), transformer::NormCase{2, 257, true}, DType::BF16, DType::F32);
}

TEST_CASE("cuda layer_norm with bias only repeats bit for bit and its dbias has the CPU's bits", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  const int64_t rows = 9, cols = 43;
  const std::vector<float> xv = math::values(rows * cols, 85, DType::BF16), gv = math::values(rows * cols, 86, DType::BF16);
  const std::vector<float> bv = math::values(cols, 87, DType::F32);
  // y, mean, rstd, dx and dbias (no weight, no dweight), as bits.
  auto run = [&](Device dev) {
    const Tensor x = math::make(xv, Shape{rows, cols}, DType::BF16, dev), dy = math::make(gv, x.shape(), DType::BF16, dev);
    const Tensor b = math::make(bv, Shape{cols}, DType::F32, dev);
    Tensor y = Tensor::empty(x.shape(), DType::BF16, dev), dx = Tensor::empty(x.shape(), DType::BF16, dev);
    Tensor mean = Tensor::empty(Shape{rows}, DType::F32, dev), rstd = Tensor::empty(Shape{rows}, DType::F32, dev);
    Tensor db = Tensor::zeros(Shape{cols}, DType::F32, dev);
    backend_for(dev).layer_norm(x, nullptr, &b, 1e-5f, y, mean, rstd);
    backend_for(dev).layer_norm_backward(x, nullptr, mean, rstd, dy, dx, nullptr, &db, false);
    std::vector<float> all;
    for (const Tensor* t : {&y, &mean, &rstd, &dx, &db}) {
      const std::vector<float> v = math::host(*t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return bits_of(all);
  };
  const std::vector<uint32_t> g = run(Device::cuda()), c = run(Device::cpu());
  CHECK(run(Device::cuda()) == g);
  // dbias is the column sums of dy: in double, rows in order within a chunk, on both backends.
  CHECK(std::vector<uint32_t>(g.end() - cols, g.end()) == std::vector<uint32_t>(c.end() - cols, c.end()));
}

TEST_CASE("cuda embedding and layer_norm as autograd ops: values and gradients as on the CPU", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  // loss = sum(layer_norm(embedding(table, ids), w, b)^2 * 0.5-ish weights): every gradient
  // path (table through the backward's buckets, w and b through the parameter sums).
  auto run = [](Device dev) {
    const int64_t vocab = 9, dim = 12, n = 10;
    Var table(math::make(math::values(vocab * dim, 91, DType::F32), Shape{vocab, dim}, DType::F32, dev), true);
    Var w(math::make(math::values(dim, 92, DType::F32, 0.5f, 1.5f), Shape{dim}, DType::F32, dev), true);
    Var b(math::make(math::values(dim, 93, DType::F32), Shape{dim}, DType::F32, dev), true);
    const Var mix(math::make(math::values(n * dim, 94, DType::F32), Shape{2, 5, dim}, DType::F32, dev));
    const Tensor ids = math::make(transformer::repeated_ids(n, vocab), Shape{2, 5}, DType::F32, dev);
    Var y = layer_norm(embedding(table, ids), w, b);
    Var loss = sum(mul(y, add(y, mix)));
    loss.backward();
    std::vector<float> out = math::host(loss.value());
    for (const Tensor* t : {&table.grad(), &w.grad(), &b.grad()}) {
      const std::vector<float> g = math::host(*t);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  check_graph_matches_cpu(run(Device::cuda()), run(Device::cpu()));
}

TEST_CASE("cuda layer_norm_backward refuses a dweight or dbias that is not FP32 of the row width", "[gpu][transformer]") {
  BELAY_REQUIRE_GPU();
  const Device dev = Device::cuda();
  const int64_t rows = 2, cols = 8;
  const Tensor x = math::make(math::values(rows * cols, 91, DType::F32), Shape{rows, cols}, DType::F32, dev);
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev), dx = Tensor::empty(x.shape(), DType::F32, dev);
  Tensor mean = Tensor::empty(Shape{rows}, DType::F32, dev), rstd = Tensor::empty(Shape{rows}, DType::F32, dev);
  backend_for(dev).layer_norm(x, nullptr, nullptr, 1e-5f, y, mean, rstd);
  Tensor half_db = Tensor::zeros(Shape{cols}, DType::F16, dev), short_db = Tensor::zeros(Shape{cols - 1}, DType::F32, dev);
  for (Tensor* bad : {&half_db, &short_db})
    CHECK_THROWS_WITH(backend_for(dev).layer_norm_backward(x, nullptr, mean, rstd, x, dx, nullptr, bad, false),
                      Catch::Contains("dweight and dbias must be fp32 of 8 elements"));
}
