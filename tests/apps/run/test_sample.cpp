// belay sample (apps/run/sample.h) on a tiny trained GPT: temperature 0 is the argmax of the
// model's last row, written here as a plain loop over forward; a seed repeats its text and
// another seed changes it; the KV cache gives the tokens of the path without it (greedy and
// drawn, across the window's slide, in FP32, FP16 and BF16); the text is streamed a token at a
// time; the draw follows softmax(logits / T); every bad input is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "amp/autocast.h"
#include "apps/run/sample.h"
#include "apps/run/train.h"
#include "autograd/graph.h"
#include "engine/error.h"
#include "engine/random.h"
#include "tests/apps/run/tiny_gpt.h"

using namespace belay;

TEST_CASE("sample: temperature 0 is the argmax of forward's last row, token by token", "[apps][sample]") {
  const std::string tokens = test::tiny_tokens_file("sample0"), ck = test::tiny_gpt_checkpoint("sample0", tokens);
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(ck);
  REQUIRE(model->config().vocab == 128);
  REQUIRE(model->config().context == 8);
  const std::vector<int32_t> prompt = bytes_to_tokens("def ");
  const int64_t count = 12;  // past the context: the window slides
  // The hand loop: the window of the last 8 ids, the last row's largest logit (lowest id on a tie).
  std::vector<int32_t> ids = prompt, expected;
  {
    NoGrad no_grad;
    for (int64_t n = 0; n < count; ++n) {
      const size_t t = std::min<size_t>(ids.size(), 8);
      const std::vector<float> w(ids.end() - static_cast<long>(t), ids.end());
      const std::vector<float> l =
          model->forward(Var(Tensor::from_vector(w, Shape{1, static_cast<int64_t>(t)}))).value().to_vector();
      int32_t best = 0;
      for (int32_t j = 1; j < 128; ++j)
        if (l[(t - 1) * 128 + j] > l[(t - 1) * 128 + best]) best = j;
      ids.push_back(best);
      expected.push_back(best);
    }
  }
  CHECK(generate(*model, prompt, count, 0.0, 0, 1) == expected);
  CHECK(generate(*model, prompt, count, 0.0, 0, 2) == expected);  // no draw: the seed is unused
  CHECK(generate(*model, prompt, count, 0.7, 1, 3) == expected);  // top-1 is the argmax too
  SampleConfig c;
  c.checkpoint = ck;
  c.prompt = "def ";
  c.tokens = count;
  c.temperature = 0.0;
  CHECK(sample_text(c) == "def " + tokens_to_bytes(expected));
  std::remove(ck.c_str());
  std::remove(tokens.c_str());
}

TEST_CASE("sample: the same seed gives the same text, another seed another", "[apps][sample]") {
  const std::string tokens = test::tiny_tokens_file("sample1"), ck = test::tiny_gpt_checkpoint("sample1", tokens, 2);
  SampleConfig c;
  c.checkpoint = ck;
  c.prompt = "re";
  c.tokens = 40;
  c.temperature = 1.5;  // a barely trained model: nearly uniform draws, 40 of them
  c.seed = 1;
  const std::string a = sample_text(c);
  CHECK(a.size() == 42);
  CHECK(a.substr(0, 2) == "re");
  CHECK(sample_text(c) == a);
  c.seed = 2;
  CHECK(sample_text(c) != a);
  c.top_k = 3;  // every drawn token is among the 3 largest logits of its step
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(ck);
  const std::vector<int32_t> drawn = generate(*model, bytes_to_tokens("re"), 10, 1.5, 3, 5);
  std::vector<int32_t> ids = bytes_to_tokens("re");
  NoGrad no_grad;
  for (int32_t id : drawn) {
    const size_t t = std::min<size_t>(ids.size(), 8);
    const std::vector<float> w(ids.end() - static_cast<long>(t), ids.end());
    const std::vector<float> l =
        model->forward(Var(Tensor::from_vector(w, Shape{1, static_cast<int64_t>(t)}))).value().to_vector();
    int larger = 0;
    for (int32_t j = 0; j < 128; ++j) larger += l[(t - 1) * 128 + j] > l[(t - 1) * 128 + id];
    CHECK(larger < 3);
    ids.push_back(id);
  }
  std::remove(ck.c_str());
  std::remove(tokens.c_str());
}

TEST_CASE("sample: the KV cache gives the tokens of the full window, across its slide", "[apps][sample]") {
  const std::string tokens = test::tiny_tokens_file("sample3"), ck = test::tiny_gpt_checkpoint("sample3", tokens, 3);
  std::unique_ptr<Gpt> model = load_gpt_checkpoint(ck);
  const std::vector<int32_t> prompt = bytes_to_tokens("def ");
  const int64_t count = 21;  // 4 + 21 = 25 tokens through a context of 8: the window slides 17 times
  struct Draw {
    double temperature;
    int64_t top_k;
    uint64_t seed;
  };
  // The cached logits have the reference's bits in every dtype on the CPU (test_gpt_decode.cpp),
  // so the tokens must match exactly, drawn ones included: a barely trained model at T = 1.5
  // draws nearly uniformly, and one differing bit of a logit could move a draw.
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    model->set_working_dtype(dtype);
    Autocast autocast(dtype, dtype != DType::F32);
    for (const Draw& d : {Draw{0.0, 0, 1}, Draw{1.5, 0, 7}, Draw{1.0, 5, 9}}) {
      INFO(dtype_name(dtype) << " temperature " << d.temperature << " top-k " << d.top_k << " seed " << d.seed);
      std::vector<int32_t> seen;
      const std::vector<int32_t> cached = generate(*model, prompt, count, d.temperature, d.top_k, d.seed, true,
                                                   [&](int32_t id) { seen.push_back(id); });
      CHECK(cached == generate(*model, prompt, count, d.temperature, d.top_k, d.seed, false));
      CHECK(seen == cached);  // each token passed on as it was picked, in order
    }
  }
  std::remove(ck.c_str());
  std::remove(tokens.c_str());
}

TEST_CASE("sample: the text is streamed: the prompt first, then each token's bytes", "[apps][sample]") {
  const std::string tokens = test::tiny_tokens_file("sample4"), ck = test::tiny_gpt_checkpoint("sample4", tokens, 2);
  SampleConfig c;
  c.checkpoint = ck;
  c.prompt = "re";
  c.tokens = 12;
  c.temperature = 1.2;
  c.seed = 4;
  std::vector<std::string> chunks;
  sample_stream(c, [&](const std::string& bytes) { chunks.push_back(bytes); });
  // An ASCII vocabulary: every token is a whole character, so each goes out alone.
  REQUIRE(chunks.size() == 13);
  CHECK(chunks[0] == "re");
  std::string whole;
  for (const auto& part : chunks) {
    CHECK(!part.empty());
    whole += part;
  }
  CHECK(whole == sample_text(c));
  c.kv_cache = false;
  CHECK(whole == sample_text(c));
  // Nothing is emitted before every option has been checked.
  c.top_k = -1;
  chunks.clear();
  CHECK_THROWS_AS(sample_stream(c, [&](const std::string& bytes) { chunks.push_back(bytes); }), UsageError);
  CHECK(chunks.empty());
  std::remove(ck.c_str());
  std::remove(tokens.c_str());
}

TEST_CASE("sample: a draw follows softmax(logits / T) over the top k", "[apps][sample]") {
  // Logits log 1, log 2, log 3, -inf-like at T = 1: probabilities 1/6, 2/6, 3/6 (the last
  // ~0). 60000 draws: each frequency within 5 standard deviations (the seed is fixed, so the
  // outcome is too; the bound says the draw is the distribution's, not a tuned number).
  const float logits[4] = {0.0f, std::log(2.0f), std::log(3.0f), -100.0f};
  const int n = 60000;
  for (int64_t top_k : {0, 3, 2}) {
    Rng rng(7);
    int hits[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; ++i) ++hits[pick_token(logits, 4, 1.0, top_k, rng)];
    const double total = top_k == 2 ? 5.0 : 6.0;  // top 2: ids 2 and 1 only
    const double p[4] = {top_k == 2 ? 0.0 : 1 / total, 2 / total, 3 / total, 0.0};
    for (int j = 0; j < 4; ++j) {
      const double sd = std::sqrt(n * p[j] * (1 - p[j]));
      INFO("top_k " << top_k << " id " << j << ": " << hits[j] << " hits, expected " << n * p[j]);
      CHECK(std::fabs(hits[j] - n * p[j]) <= 5 * sd);
    }
  }
  // A tie at temperature 0: the lowest id. A non-finite logit: an error, not a token.
  const float tie[3] = {1.0f, 2.0f, 2.0f};
  Rng rng(0);
  CHECK(pick_token(tie, 3, 0.0, 0, rng) == 1);
  const float bad[2] = {1.0f, NAN};
  CHECK_THROWS_WITH(pick_token(bad, 2, 1.0, 0, rng), Catch::Contains("not finite"));
}

TEST_CASE("sample: bad input is refused with a line that says what to do", "[apps][sample]") {
  const std::string tokens = test::tiny_tokens_file("sample2"), ck = test::tiny_gpt_checkpoint("sample2", tokens, 1);
  SampleConfig c;
  c.checkpoint = ck;
  c.prompt = "x";
  c.tokens = 3;
  auto refused = [&](SampleConfig bad, const std::string& what) {
    INFO(what);
    CHECK_THROWS_AS(sample_text(bad), UsageError);
    CHECK_THROWS_WITH(sample_text(bad), Catch::Contains(what));
  };
  SampleConfig b = c;
  b.prompt = "";
  refused(b, "--prompt is empty");
  b = c;
  b.prompt = "x\xe9";
  refused(b, "prompt byte 1 (value 233) is not in the model's vocabulary of 128");
  b = c;
  b.temperature = -0.5;
  refused(b, "--temperature must be a finite number >= 0");
  b.temperature = NAN;
  refused(b, "--temperature must be a finite number >= 0");
  b = c;
  b.tokens = 0;
  refused(b, "--tokens must be at least 1");
  b = c;
  b.top_k = -1;
  refused(b, "--top-k must be >= 0");
  // A checkpoint of a Linear run is not a GPT.
  TrainConfig lc;
  lc.steps = 2;
  lc.quiet = true;
  lc.checkpoint = test::temp_path("sample2", "linear.ck");
  std::ostringstream out;
  run_training(lc, out);
  b = c;
  b.checkpoint = lc.checkpoint;
  refused(b, "is of a linear model, not a GPT");
  b.checkpoint = tokens;  // not a checkpoint at all
  CHECK_THROWS_AS(sample_text(b), UsageError);
  for (const std::string& f : {ck, tokens, lc.checkpoint}) std::remove(f.c_str());
}
