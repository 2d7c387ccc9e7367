// Incremental decoding (autograd/gpt_decode.h): the logits of Gpt::forward_cached, a prompt
// then one token at a time, are forward's last row on the whole sequence bit for bit, in FP32
// and under FP16 / BF16 autocast on the CPU (every op there is computed row by row with a
// reduction order that does not depend on the number of rows); the cache's rows are the k and v
// it was given; and misuse is refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "amp/autocast.h"
#include "autograd/gpt_decode.h"
#include "autograd/graph.h"
#include "engine/error.h"
#include "engine/random.h"

using namespace belay;

namespace {

GptConfig decode_config(bool fused_attention = true) {
  GptConfig c;
  c.fused_attention = fused_attention;
  c.vocab = 23;
  c.context = 16;
  c.width = 32;
  c.layers = 2;
  c.heads = 4;
  return c;
}

// ids [B, n] as FP32: the first n of each of the B sequences in `seqs`.
Tensor ids_of(const std::vector<std::vector<float>>& seqs, int64_t begin, int64_t end) {
  std::vector<float> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin() + begin, s.begin() + end);
  return Tensor::from_vector(flat, Shape{static_cast<int64_t>(seqs.size()), end - begin});
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("gpt decode: a prompt then one token at a time gives forward's last rows, bit for bit",
          "[autograd][gpt][decode]") {
  const bool fused = GENERATE(true, false);
  INFO((fused ? "fused attention" : "naive attention"));
  const GptConfig c = decode_config(fused);
  const int64_t batch = 2, prompt = 5;
  Rng rng(11);
  std::vector<std::vector<float>> seqs(batch);
  for (auto& s : seqs)
    for (int64_t t = 0; t < c.context; ++t) s.push_back(static_cast<float>(rng.next_u64() % c.vocab));
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    INFO("dtype " << dtype_name(dtype));
    Rng init(3);
    Gpt gpt(c, init);
    gpt.set_working_dtype(dtype);
    NoGrad no_grad;
    Autocast autocast(dtype, dtype != DType::F32);
    KvCache cache(c, batch);
    for (int64_t n = prompt; n <= c.context; ++n) {
      INFO("positions " << n);
      // The prompt at once, then the newest token alone.
      const int64_t begin = n == prompt ? 0 : n - 1;
      const std::vector<float> got = gpt.forward_cached(Var(ids_of(seqs, begin, n)), cache).value().to_vector();
      CHECK(cache.length() == n);
      const std::vector<float> all = gpt.forward(Var(ids_of(seqs, 0, n))).value().to_vector();  // [B n, V]
      std::vector<float> want;
      for (int64_t b = 0; b < batch; ++b)
        want.insert(want.end(), all.begin() + ((b + 1) * n - 1) * c.vocab, all.begin() + (b + 1) * n * c.vocab);
      REQUIRE(got.size() == want.size());
      CHECK(same_bits(got, want));
    }
    CHECK(cache.layers[0].k.dtype() == dtype);
    // Full: one more position is refused; cleared, the cache starts again at position 0.
    CHECK_THROWS_WITH(gpt.forward_cached(Var(ids_of(seqs, 0, 1)), cache), Catch::Contains("do not fit the context"));
    cache.clear();
    const std::vector<float> again = gpt.forward_cached(Var(ids_of(seqs, 0, 3)), cache).value().to_vector();
    const std::vector<float> all = gpt.forward(Var(ids_of(seqs, 0, 3))).value().to_vector();
    CHECK(same_bits({again.begin(), again.begin() + c.vocab}, {all.begin() + 2 * c.vocab, all.begin() + 3 * c.vocab}));
  }
}

TEST_CASE("gpt decode: the cache holds the k and v it was given, item by item", "[autograd][gpt][decode]") {
  KvLayer layer;
  layer.batch = 2;
  layer.heads = 3;
  layer.capacity = 5;
  layer.head_dim = 2;
  // Value 1000 b + 100 h + 10 p + j at item (b, h), position p, element j.
  auto rows = [](int64_t t, int64_t start, float offset) {
    std::vector<float> x;
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 3; ++h)
        for (int64_t p = start; p < start + t; ++p)
          for (int j = 0; j < 2; ++j) x.push_back(offset + 1000.0f * b + 100.0f * h + 10.0f * p + j);
    return Tensor::from_vector(x, Shape{2, 3, t, 2});
  };
  layer.write(rows(2, 0, 0.0f), rows(2, 0, 0.5f), 0);
  layer.write(rows(1, 2, 0.0f), rows(1, 2, 0.5f), 2);
  CHECK(layer.keys(3).to_vector() == rows(3, 0, 0.0f).to_vector());
  CHECK(layer.values(3).to_vector() == rows(3, 0, 0.5f).to_vector());
  CHECK(layer.keys(1).to_vector() == rows(1, 0, 0.0f).to_vector());
  layer.write(rows(2, 3, 0.0f), rows(2, 3, 0.5f), 3);
  CHECK(layer.keys(5).to_vector() == rows(5, 0, 0.0f).to_vector());  // full: the cache itself
  CHECK_THROWS_WITH(layer.write(rows(1, 5, 0.0f), rows(1, 5, 0.0f), 5), Catch::Contains("do not fit its 5"));
  CHECK_THROWS_WITH(layer.keys(6), Catch::Contains("of a cache of 5"));
  const Tensor half = rows(1, 0, 0.0f).to(DType::F16);
  CHECK_THROWS_WITH(layer.write(half, half, 1), Catch::Contains("clear the cache"));
  CHECK_THROWS_WITH(layer.write(Tensor::zeros(Shape{2, 3, 1, 4}), Tensor::zeros(Shape{2, 3, 1, 4}), 0),
                    Catch::Contains("expected k and v [2, 3, t, 2]"));
}

TEST_CASE("gpt decode: misuse is refused", "[autograd][gpt][decode]") {
  const GptConfig c = decode_config();
  Rng init(3);
  Gpt gpt(c, init);
  KvCache cache(c, 1);
  const Tensor ids = Tensor::from_vector({1, 2, 3}, Shape{1, 3});
  CHECK_THROWS_WITH(gpt.forward_cached(Var(ids), cache), Catch::Contains("call it under NoGrad"));
  NoGrad no_grad;
  KvCache two(c, 2);
  CHECK_THROWS_WITH(gpt.forward_cached(Var(ids), two), Catch::Contains("made for another batch"));
  CHECK_THROWS_AS(KvCache(c, 0), UsageError);
  gpt.forward_cached(Var(ids), cache);
  CHECK_THROWS_WITH(gpt.forward_cached(Var(ids), cache), Catch::Contains("not 3 tokens after 3"));
  CHECK(cache.length() == 3);
  const Var q(Tensor::zeros(Shape{1, 4, 2, 8})), k(Tensor::zeros(Shape{1, 4, 3, 8}));
  CHECK_THROWS_WITH(attend_cached(q, k, k, 1.0f, false), Catch::Contains("2 queries against 3 keys"));
  // Tq = Tk and Tq = 1 are the two forms: the square causal mask, and no mask.
  for (bool fused : {false, true}) {
    CHECK(attend_cached(Var(Tensor::zeros(Shape{1, 4, 3, 8})), k, k, 1.0f, fused).shape() == Shape{1, 4, 3, 8});
    CHECK(attend_cached(Var(Tensor::zeros(Shape{1, 4, 1, 8})), k, k, 1.0f, fused).shape() == Shape{1, 4, 1, 8});
  }
}
