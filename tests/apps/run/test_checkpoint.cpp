// Checkpoints as belay train uses them (the library API alone: tests/amp/test_checkpoint.cpp):
// a resumed run is the same run, bit for bit; bad files and other settings are clear errors that overwrite nothing.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "amp/checkpoint.h"
#include "apps/run/train.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "tests/files.h"

using namespace belay;
using belay::test::slurp;
using belay::test::spit;

namespace {

std::string tmp(const std::string& name) { return test::temp_path("ckpt_test", name); }

// A run that exercises every piece of resumable state: an MLP, accumulation (2 x 8), a
// warmup + cosine schedule, clipping, and skipped steps on both sides of the checkpoint.
TrainConfig config(DType dtype) {
  TrainConfig c;
  c.model = "mlp";
  c.in_features = 12;
  c.hidden = 16;
  c.out_features = 3;
  c.batch = 16;
  c.micro_batch = 8;
  c.steps = 16;
  c.dtype = dtype;
  c.schedule = "cosine";
  c.warmup = 3;
  c.max_norm = 0.5f;
  c.inject_inf = {4, 11};
  c.scaler.growth_interval = 3;  // the scale grows and backs off around the checkpoint
  c.quiet = true;
  return c;
}

TrainResult run(const TrainConfig& c) {
  std::ostringstream out;
  return run_training(c, out);
}

}  // namespace

TEST_CASE("N steps in one go equal K steps, stop, resume, N-K steps: same rows, same bits", "[apps][checkpoint]") {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    INFO("dtype " << dtype_name(dt));
    const std::string csv_one = tmp("one.csv"), csv_two = tmp("two.csv"), ckpt = tmp("run.safetensors");
    TrainConfig whole = config(dt);
    whole.csv = csv_one;
    const TrainResult a = run(whole);

    TrainConfig leg1 = config(dt);
    leg1.csv = csv_two;
    leg1.checkpoint = ckpt;
    leg1.stop_at = 7;
    const TrainResult b1 = run(leg1);
    REQUIRE(b1.rows.size() == 7);

    TrainConfig leg2 = config(dt);
    leg2.csv = csv_two;
    leg2.resume = ckpt;
    const TrainResult b2 = run(leg2);
    REQUIRE(b2.rows.size() == 9);
    CHECK(b2.rows.front().step == 7);

    CHECK(slurp(csv_one) == slurp(csv_two));
    REQUIRE(a.final_weights.size() == b2.final_weights.size());
    CHECK(std::memcmp(a.final_weights.data(), b2.final_weights.data(), a.final_weights.size() * 4) == 0);
    if (dt == DType::F16) CHECK(a.rows[4].skipped);
    std::remove(csv_one.c_str());
    std::remove(csv_two.c_str());
    std::remove(ckpt.c_str());
  }
}

TEST_CASE("resuming into the log drops the rows after the checkpoint", "[apps][checkpoint]") {
  const std::string csv = tmp("drop.csv"), ckpt = tmp("drop.safetensors"), ref_csv = tmp("ref.csv");
  TrainConfig ref = config(DType::F32);
  ref.csv = ref_csv;
  run(ref);
  // A first leg that checkpoints at step 5 and runs on to 9 (as if killed after step 8).
  TrainConfig leg1 = config(DType::F32);
  leg1.csv = csv;
  leg1.stop_at = 9;
  leg1.checkpoint = ckpt;
  leg1.checkpoint_every = 5;
  run(leg1);
  // The end-of-run checkpoint is at 9: rewrite the step-5 one by running to 5 again.
  TrainConfig at5 = config(DType::F32);
  at5.stop_at = 5;
  at5.checkpoint = ckpt;
  run(at5);
  TrainConfig leg2 = config(DType::F32);
  leg2.csv = csv;
  leg2.resume = ckpt;
  run(leg2);
  CHECK(slurp(csv) == slurp(ref_csv));
  for (auto& p : {csv, ckpt, ref_csv}) std::remove(p.c_str());
}

TEST_CASE("a checkpoint opens as plain safetensors under the documented names", "[apps][checkpoint]") {
  const std::string ckpt = tmp("names.safetensors"), weights = tmp("weights.safetensors");
  TrainConfig c = config(DType::F16);
  c.stop_at = 3;
  c.checkpoint = ckpt;
  run(c);
  const SafetensorsFile f = read_safetensors(ckpt);
  for (const char* name : {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                           "optim.layers.0.weight.exp_avg", "optim.layers.1.bias.exp_avg_sq"}) {
    INFO(name);
    CHECK(f.contains(name));
    CHECK(f.entry(name).dtype == "F32");
  }
  CHECK(f.entry("layers.0.weight").shape == std::vector<int64_t>{16, 12});
  CHECK(f.meta("format") == kCheckpointFormat);
  CHECK(f.meta("next_step") == "3");
  CHECK(f.meta("setting.dtype") == "fp16");
  export_weights(ckpt, weights);
  const SafetensorsFile w = read_safetensors(weights);
  CHECK(w.names() == std::vector<std::string>{"layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"});
  CHECK(slurp(ckpt).size() > slurp(weights).size());
  // --init from the exported weights starts a run from them.
  TrainConfig from = config(DType::F32);
  from.init = weights;
  from.steps = 1;
  from.schedule = "constant";  // a warmup of 3 steps is longer than this one-step run
  from.warmup = 0;
  CHECK_NOTHROW(run(from));
  std::remove(ckpt.c_str());
  std::remove(weights.c_str());
}

TEST_CASE("bad checkpoints and other settings are clear errors that overwrite nothing", "[apps][checkpoint]") {
  const std::string ckpt = tmp("bad.safetensors"), csv = tmp("bad.csv");
  TrainConfig c = config(DType::F32);
  c.stop_at = 4;
  c.checkpoint = ckpt;
  c.csv = csv;
  run(c);
  const std::string good = slurp(ckpt), good_csv = slurp(csv);
  auto resume_fails_with = [&](const std::string& bytes, TrainConfig r, const std::string& message) {
    spit(ckpt, bytes);
    r.resume = ckpt;
    r.checkpoint = ckpt;
    r.csv = csv;
    INFO("expecting: " << message);
    CHECK_THROWS_WITH(run(r), Catch::Contains(message) && Catch::Contains(ckpt));
    CHECK(slurp(ckpt) == bytes);    // nothing overwritten
    CHECK(slurp(csv) == good_csv);  // the log untouched
  };
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, size_t{40}, good.size() / 2, good.size() - 1})
    resume_fails_with(good.substr(0, cut), config(DType::F32), "");
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;  // a byte of tensor data
  resume_fails_with(flipped, config(DType::F32), "checksum");
  std::string header = good;
  header[0] = 'x';  // the header length
  resume_fails_with(header, config(DType::F32), "");
  TrainConfig other_lr = config(DType::F32);
  other_lr.lr = 0.02f;
  resume_fails_with(good, other_lr, "lr");
  TrainConfig other_dtype = config(DType::BF16);
  resume_fails_with(good, other_dtype, "dtype");
  TrainConfig other_shape = config(DType::F32);
  other_shape.hidden = 8;
  resume_fails_with(good, other_shape, "hidden");
  std::remove(ckpt.c_str());
  std::remove(csv.c_str());
}

TEST_CASE("user data: regression and class labels from safetensors, errors that name the problem", "[apps][data]") {
  const std::string path = tmp("data.safetensors");
  std::vector<float> x(64 * 4), y(64 * 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) / 11.0f - 0.5f;
  for (size_t r = 0; r < 64; ++r) {
    y[r * 2] = x[r * 4] + 2.0f * x[r * 4 + 1];
    y[r * 2 + 1] = -x[r * 4 + 2];
  }
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{64, 4}, DType::BF16)}, {"y", Tensor::from_vector(y, Shape{64, 2})}});
  TrainConfig c;
  c.data = path;
  c.batch = 16;
  c.steps = 150;
  c.quiet = true;
  const TrainResult r = run(c);
  CHECK(r.final_loss < r.first_loss / 10.0f);

  // Class labels (I64) need the MLP and train with cross-entropy.
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < 64; ++i) labels[i] = x[i * 4] > 0.0f ? 1 : 0;
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{64, 4})}}, {}, {{"y", labels}});
  c.model = "mlp";
  c.hidden = 16;
  const TrainResult cls = run(c);
  CHECK(cls.final_loss < cls.first_loss / 2.0f);
  c.model = "linear";
  CHECK_THROWS_WITH(run(c), Catch::Contains("--model mlp"));

  x[5 * 4 + 3] = NAN;
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{64, 4})}, {"y", Tensor::from_vector(y, Shape{64, 2})}});
  CHECK_THROWS_WITH(run(c), Catch::Contains("row 5"));
  x[5 * 4 + 3] = 0.5f;
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{64, 4})}});
  CHECK_THROWS_WITH(run(c), Catch::Contains("no tensor 'y'"));
  write_safetensors(path, {{"x", Tensor::from_vector(x, Shape{64, 4})}, {"y", Tensor::from_vector(y, Shape{32, 4})}});
  CHECK_THROWS_WITH(run(c), Catch::Contains("y must be"));
  std::remove(path.c_str());
}
