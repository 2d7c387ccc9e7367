// Checkpoints through the library API alone (no CLI, no run_training): what a C++ user
// calls. A resume is the same run bit for bit; a bad file is a clear error that changes
// nothing; a failed write leaves the previous file; the distributed save writes only on
// rank 0 and only when the replicas agree.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "amp/dist/communicator.h"
#include "amp/safe_step.h"
#include "autograd/modules.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/safetensors.h"
#include "optim/adamw.h"
#include "tolerance.h"
#include "tests/files.h"

using namespace belay;
using belay::test::slurp;
using belay::test::spit;
using belay::test::bits_of;

namespace {

std::string tmp(const std::string& name) { return test::temp_path("amp_ckpt", name); }

// One FP16 training loop with loss scaling, as a user writes it: its whole state is the
// model, the optimizer, the scaler and the step index.
struct Loop {
  Rng rng;
  Linear model;
  AdamW opt;
  GradScaler scaler;
  SafeStep step;
  Tensor x, y;

  explicit Loop(uint64_t seed)
      : rng(seed),
        model(8, 3, rng),
        opt(model.parameters(), AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, false}),
        scaler(Device::cpu(), GradScalerOptions{{.growth_interval = 2}}),
        step(opt, scaler, LrSchedule::constant(1e-2f), SafeStepOptions{.max_norm = 0.5f}) {
    model.set_working_dtype(DType::F16);
    Rng data(11);  // the same data in every loop, whatever the weights' seed
    std::vector<float> xv(16 * 8), yv(16 * 3);
    for (float& v : xv) v = data.normal();
    for (float& v : yv) v = data.normal();
    x = Tensor::from_vector(xv, Shape{16, 8});
    y = Tensor::from_vector(yv, Shape{16, 3});
    // A skipped step inside the run: the scaler backs off, the optimizer count stays.
    step.after_backward = [](int64_t s, Optimizer& o) {
      if (s == 3) o.mutable_grads()[0]->set_element(0, INFINITY);
    };
  }

  void train(int steps) {
    for (int i = 0; i < steps; ++i)
      step.run([&](int) {
        Autocast fp16(DType::F16);
        return mse_loss(model(Var(x)), y);
      });
  }

  RunState state() const {
    RunState st;
    st.next_step = step.next_step();
    st.optimizer_steps = opt.step_count();
    st.scaler = scaler.state();
    st.data_position = "row 0";
    st.settings = {{"dtype", "fp16"}, {"lr", exact_float(1e-2f)}};
    return st;
  }

  std::vector<uint32_t> bits() {  // masters, then moments
    std::vector<uint32_t> out;
    for (const Var& p : model.parameters())
      for (uint32_t b : bits_of(p.master())) out.push_back(b);
    for (auto& [name, t] : opt.state_tensors())
      for (uint32_t b : bits_of(*t)) out.push_back(b);
    return out;
  }
};

// A communicator of a pretend world: rank `rank` of 2, whose replicas agree or not.
class FakeComm final : public Communicator {
 public:
  FakeComm(int rank, bool agree) : rank_(rank), agree_(agree) {}
  int world_size() const override { return 2; }
  int rank() const override { return rank_; }
  std::string name() const override { return "fake"; }
  void all_reduce_gradients(const std::vector<Tensor*>&) override {}
  bool replicas_agree(uint64_t checksum) override {
    seen = checksum;
    return agree_;
  }
  uint64_t seen = 0;

 private:
  int rank_;
  bool agree_;
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("library checkpoint: save, load into a fresh loop, continue: the same bits as never stopping", "[amp][checkpoint]") {
  const std::string path = tmp("resume.safetensors");
  Loop whole(1);
  whole.train(10);

  Loop first(1);
  first.train(5);
  save_checkpoint(path, first.model, first.opt, first.state());

  Loop second(99);  // other initial weights: everything must come from the file
  const RunState st = load_checkpoint(path, second.model, second.opt, {{"dtype", "fp16"}, {"lr", exact_float(1e-2f)}});
  CHECK(st.next_step == 5);
  CHECK(st.optimizer_steps == 4);  // step 3 was skipped
  CHECK(st.data_position == "row 0");
  REQUIRE(st.scaler_state_loaded);
  second.scaler.load_state(st.scaler);
  second.step.set_next_step(st.next_step);
  second.train(5);
  CHECK(second.bits() == whole.bits());
  CHECK(same_bits(second.scaler.state().scale, whole.scaler.state().scale));
  CHECK(second.opt.step_count() == whole.opt.step_count());
  std::remove(path.c_str());
}

TEST_CASE("inspect_checkpoint reads a file alone: state, settings, random streams, tensors", "[amp][checkpoint]") {
  const std::string path = tmp("inspect.safetensors");
  Loop loop(2);
  loop.train(4);
  RunState st = loop.state();
  Rng shared(5);
  shared.next_u64();
  st.rng_states["data"] = shared.state();
  st.records["3.note"] = "a record";
  save_checkpoint(path, loop.model, loop.opt, st);
  const CheckpointInfo info = inspect_checkpoint(path);
  CHECK(info.state.next_step == 4);
  CHECK(info.state.optimizer_steps == 3);
  CHECK(same_bits(info.state.scaler.scale, loop.scaler.state().scale));
  CHECK(info.state.settings == st.settings);
  CHECK(info.state.records == st.records);
  REQUIRE(info.state.rng_states.count("data"));
  CHECK(info.state.rng_states.at("data") == shared.state());  // a shared stream resumes bit for bit
  CHECK(!info.cpu_isa.empty());
  CHECK(info.tensors.at("weight") == std::vector<int64_t>{3, 8});
  CHECK(info.tensors.count("optim.weight.exp_avg_sq"));
  CHECK(read_safetensors(path).meta("rng_rank_streams") == kRankStreamDerivation);
  CHECK(checkpoint_setting(path, "dtype") == "fp16");
  CHECK(checkpoint_setting(path, "absent").empty());
  std::remove(path.c_str());
}

TEST_CASE("a truncated or corrupt checkpoint is a clear error that leaves the model untouched", "[amp][checkpoint]") {
  const std::string path = tmp("bad.safetensors");
  Loop loop(3);
  loop.train(3);
  save_checkpoint(path, loop.model, loop.opt, loop.state());
  const std::string good = slurp(path);
  Loop target(4);
  const std::vector<uint32_t> before = target.bits();
  auto fails = [&](const std::string& bytes, const std::string& message) {
    spit(path, bytes);
    INFO("expecting: " << message);
    CHECK_THROWS_AS(inspect_checkpoint(path), UsageError);
    CHECK_THROWS_WITH(inspect_checkpoint(path), Catch::Contains(path) && Catch::Contains(message));
    CHECK_THROWS_WITH(load_checkpoint(path, target.model, target.opt, loop.state().settings),
                      Catch::Contains(path) && Catch::Contains(message));
    CHECK(target.bits() == before);
  };
  for (size_t cut : {size_t{0}, size_t{7}, size_t{8}, size_t{60}, good.size() / 2, good.size() - 1})
    fails(good.substr(0, cut), "");
  std::string flipped = good;
  flipped[flipped.size() - 2] ^= 0x04;  // a byte of tensor data
  fails(flipped, "checksum");
  // A valid safetensors file that is not a checkpoint.
  write_safetensors(path, {{"weight", Tensor::from_vector(std::vector<float>(24, 0.0f), Shape{3, 8})}});
  fails(slurp(path), "not a belay checkpoint");
  // Well-formed files whose metadata lies: each names the field.
  spit(path, good);
  const SafetensorsFile ok = read_safetensors(path);
  NamedTensors tensors;
  for (const std::string& name : ok.names()) tensors.push_back({name, ok.tensor(name)});
  auto with_meta = [&](const std::string& key, const std::string& value) {
    std::map<std::string, std::string> meta;
    for (auto& [k, v] : ok.metadata())
      if (k != kChecksumKey && k != kHeaderChecksumKey) meta[k] = v;
    meta[key] = value;
    write_safetensors(path, tensors, meta);
    return slurp(path);
  };
  fails(with_meta("format", "belay.checkpoint.v0"), "format");
  fails(with_meta("next_step", "-3"), "next_step");
  fails(with_meta("scaler.scale", "big"), "scaler.scale");
  fails(with_meta("rng.data", "12345"), "random stream 'data'");
  fails(with_meta("rng_rank_streams", "rank_stream.v0"), "per-rank random streams");
  std::remove(path.c_str());
}

TEST_CASE("loading into another model names the tensor and changes nothing", "[amp][checkpoint]") {
  const std::string path = tmp("shape.safetensors");
  Loop loop(5);
  loop.train(2);
  save_checkpoint(path, loop.model, loop.opt, loop.state());
  Rng rng(6);
  Linear wider(8, 4, rng);
  AdamW opt(wider.parameters());
  const std::vector<float> before = wider.parameters()[0].master().to_vector();
  CHECK_THROWS_WITH(load_checkpoint(path, wider, opt, loop.state().settings),
                    Catch::Contains("'weight' has shape [3, 8]") && Catch::Contains("[4, 8]"));
  CHECK(wider.parameters()[0].master().to_vector() == before);
  // Other settings: refused before anything is copied.
  Loop other(7);
  const std::vector<uint32_t> other_before = other.bits();
  CHECK_THROWS_WITH(load_checkpoint(path, other.model, other.opt, {{"dtype", "fp16"}, {"lr", exact_float(2e-2f)}}),
                    Catch::Contains("lr"));
  CHECK(other.bits() == other_before);
  std::remove(path.c_str());
}

TEST_CASE("a failed save leaves the previous checkpoint as it was", "[amp][checkpoint]") {
  const std::string path = tmp("atomic.safetensors");
  Loop loop(8);
  loop.train(2);
  save_checkpoint(path, loop.model, loop.opt, loop.state());
  const std::string previous = slurp(path);
  loop.train(2);
  RunState bad = loop.state();
  bad.settings["note"] = "\xff\xfe";  // not UTF-8: refused before any file is touched
  CHECK_THROWS_AS(save_checkpoint(path, loop.model, loop.opt, bad), Error);
  CHECK(slurp(path) == previous);
  CHECK_THROWS_AS(save_checkpoint(tmp("no/such/dir/c.safetensors"), loop.model, loop.opt, loop.state()), Error);
  std::remove(path.c_str());
}

TEST_CASE("distributed save: the replicas' checksum agreed, then rank 0 alone writes", "[amp][checkpoint]") {
  const std::string path = tmp("dist.safetensors");
  Loop loop(9);
  loop.train(2);
  const uint64_t sum = replica_checksum(loop.model, loop.scaler.state());
  FakeComm rank1(1, true);
  save_checkpoint(path, loop.model, loop.opt, loop.state(), rank1);
  CHECK(rank1.seen == sum);
  CHECK(slurp(path).empty());  // rank 1 took part in the agreement but wrote nothing
  FakeComm split(0, false);
  CHECK_THROWS_WITH(save_checkpoint(path, loop.model, loop.opt, loop.state(), split), Catch::Contains("disagree"));
  CHECK(slurp(path).empty());
  FakeComm rank0(0, true);
  save_checkpoint(path, loop.model, loop.opt, loop.state(), rank0);
  CHECK(inspect_checkpoint(path).state.next_step == 2);
  // The checksum sees a single bit of a master and of the scaler state.
  ScalerState other = loop.scaler.state();
  other.growth_tracker += 1.0f;
  CHECK(replica_checksum(loop.model, other) != sum);
  std::remove(path.c_str());
}

TEST_CASE("resume check: fp32_ops missing on either side counts as none", "[amp][checkpoint]") {
  using Settings = std::map<std::string, std::string>;
  // A checkpoint from before fp32_ops existed, and a caller that does not name it: both ran
  // with autocast everywhere, so neither is a policy change.
  CHECK(belay::check_resume_settings("c", Settings{{"dtype", "fp16"}}, Settings{{"dtype", "fp16"}, {"fp32_ops", "none"}},
                                     false)
            .empty());
  CHECK(belay::check_resume_settings("c", Settings{{"dtype", "fp16"}, {"fp32_ops", "none"}}, Settings{{"dtype", "fp16"}},
                                     false)
            .empty());
  // A real difference still is one.
  CHECK_THROWS_AS(belay::check_resume_settings("c", Settings{{"dtype", "fp16"}, {"fp32_ops", "linear"}},
                                               Settings{{"dtype", "fp16"}}, false),
                  belay::UsageError);
}
