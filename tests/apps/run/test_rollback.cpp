// Rollback: a condition fires, the last good state comes back bit for bit (weights,
// optimizer, scaler, data position, LR position), the case is written down, and the run
// stops or goes on under the changed policy. And --new-experiment for a resume under
// another precision policy.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "amp/checkpoint.h"
#include "apps/run/rollback.h"
#include "apps/run/train.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "tests/files.h"

using namespace belay;
using belay::test::slurp;

namespace {

std::string tmp(const std::string& name) { return test::temp_path("rollback_test", name); }

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// FP16 with loss scaling, AdamW under a warmup + cosine schedule, micro-batches, clipping:
// every piece of state a rollback must bring back.
TrainConfig config() {
  TrainConfig c;
  c.model = "mlp";
  c.in_features = 12;
  c.hidden = 16;
  c.out_features = 3;
  c.batch = 16;
  c.micro_batch = 8;
  c.steps = 40;
  c.dtype = DType::F16;
  c.schedule = "cosine";
  c.warmup = 3;
  c.max_norm = 0.5f;
  c.scaler.growth_interval = 4;  // the scale moves between snapshots too
  c.quiet = true;
  c.rollback.every = 5;
  c.rollback.skip_window = 10;
  c.rollback.max_skip_rate = 0.5;
  return c;
}

TrainResult run(const TrainConfig& c, std::string* printed = nullptr) {
  std::ostringstream out;
  TrainResult r = run_training(c, out);
  if (printed) *printed = out.str();
  return r;
}

StepRow row(int64_t step, bool skipped, float loss = 1.0f, const std::string& reason = "nonfinite_grad") {
  StepRow r;
  r.step = step;
  r.skipped = skipped;
  r.loss = loss;
  r.skip_reason = skipped ? reason : "";
  return r;
}

}  // namespace

TEST_CASE("rollback trigger: each condition fires at its stated threshold", "[apps][rollback]") {
  RollbackOptions o;
  o.on_skip_rate = true;
  o.skip_window = 10;
  o.max_skip_rate = 0.3;  // fires on the 4th skip within 10 rows
  RollbackTrigger t(o);
  int64_t s = 0;
  for (int i = 0; i < 5; ++i) CHECK_FALSE(t.observe(row(s++, false)));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(t.observe(row(s++, true)));
  CHECK_FALSE(t.healthy());  // 3 skips: past half the margin
  const auto fired = t.observe(row(s++, true));
  REQUIRE(fired);
  CHECK(t.condition() == "skip-rate");
  CHECK_THAT(*fired, Catch::Contains("4 of the last 9 steps skipped"));
  // Skips that leave the window no longer count.
  t.reset();
  for (int i = 0; i < 3; ++i) CHECK_FALSE(t.observe(row(s++, true)));
  for (int i = 0; i < 10; ++i) CHECK_FALSE(t.observe(row(s++, false)));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(t.observe(row(s++, true)));
  CHECK(t.observe(row(s++, true)));

  RollbackOptions n;
  n.on_nonfinite_loss = true;
  RollbackTrigger tn(n);
  CHECK_FALSE(tn.observe(row(0, true)));  // a non-finite gradient is not this condition
  CHECK(tn.observe(row(1, true, INFINITY, "nonfinite_loss")));
  CHECK(tn.condition() == "nonfinite-loss");

  RollbackOptions d;
  d.on_divergence = true;
  d.divergence_factor = 4.0;
  d.divergence_warmup = 3;
  RollbackTrigger td(d);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(td.observe(row(i, false, 1.0f)));
  CHECK(td.healthy());
  // EMA 0.1: from 1, a loss of 100 lifts it to 10.9 at once (> 4 x 1).
  const auto div = td.observe(row(10, false, 100.0f));
  REQUIRE(div);
  CHECK(td.condition() == "divergence");
  CHECK_THAT(*div, Catch::Contains("above 4 x the best smoothed loss 1"));
}

TEST_CASE("rollback options are validated", "[apps][rollback]") {
  auto bad = [](auto change) {
    TrainConfig c = config();
    c.rollback.on_skip_rate = true;
    change(c);
    CHECK_THROWS_AS(check_train_config(c), UsageError);
  };
  bad([](TrainConfig& c) { c.rollback.every = 0; });
  bad([](TrainConfig& c) { c.rollback.skip_window = 0; });
  bad([](TrainConfig& c) { c.rollback.max_skip_rate = 1.0; });
  bad([](TrainConfig& c) { c.rollback.divergence_factor = 1.0; });
  bad([](TrainConfig& c) { c.rollback.policy = "retry"; });
  bad([](TrainConfig& c) {
    c.rollback.policy = "lower-lr";
    c.rollback.lr_factor = 1.5f;
  });
  bad([](TrainConfig& c) {
    c.dtype = DType::F32;
    c.rollback.policy = "fp32";
  });
  TrainConfig off = config();
  off.rollback.policy = "fp32";  // a policy without a condition
  CHECK_THROWS_AS(check_train_config(off), UsageError);
}

TEST_CASE("a forced skip rate rolls back to the snapshot: the restored state is the checkpoint's, bit for bit",
          "[apps][rollback]") {
  const std::string ckpt = tmp("fired.safetensors"), ref = tmp("ref.safetensors"), csv = tmp("fired.csv"),
                    report = tmp("fired.json");
  TrainConfig c = config();
  c.rollback.on_skip_rate = true;
  c.checkpoint = ckpt;
  c.csv = csv;
  c.rollback.report = report;
  for (int64_t s = 12; s < 30; ++s) c.inject_inf.insert(s);  // from step 12 every step skips
  std::string printed;
  const TrainResult r = run(c, &printed);
  CHECK(r.exit_code == 1);
  CHECK(r.rollbacks == 1);
  // Snapshots every 5 steps after an applied step: 0, 5, 10; the 6th skip of 10 rows fires at 17.
  CHECK(r.final_next_step == 10);
  CHECK_THAT(printed, Catch::Contains("belay: error: rollback: skip-rate") && Catch::Contains("stopping"));
  // The rows after step 17 that were in flight are logged too: nothing is lost.
  CHECK(r.rows.back().step >= 17);
  CHECK(lines_of(csv).size() == r.rows.size() + 1);

  // The same run stopped at step 10 by itself: its checkpoint is the state the rollback kept.
  TrainConfig at10 = config();
  at10.stop_at = 10;
  at10.checkpoint = ref;
  const TrainResult b = run(at10);
  REQUIRE(r.final_weights.size() == b.final_weights.size());
  CHECK(std::memcmp(r.final_weights.data(), b.final_weights.data(), r.final_weights.size() * 4) == 0);
  CHECK(std::memcmp(&r.final_scaler, &b.final_scaler, sizeof(ScalerState)) == 0);
  CHECK(r.final_scaler.scale != r.rows.back().scaler_scale);  // the scaler came back, not the backed-off one
  CHECK(r.final_optimizer_steps == b.final_optimizer_steps);
  CHECK(r.final_data_position == b.final_data_position);
  const SafetensorsFile fa = read_safetensors(ckpt), fb = read_safetensors(ref);
  REQUIRE(fa.names() == fb.names());
  for (const std::string& name : fa.names()) {
    INFO(name);
    const std::vector<float> va = fa.tensor(name).to_vector(), vb = fb.tensor(name).to_vector();
    CHECK(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0);  // moments included
  }
  for (const char* key : {"next_step", "optimizer_steps", "scaler.scale", "scaler.growth_tracker",
                          "scaler.hysteresis_left", "data_position"}) {
    INFO(key);
    CHECK(fa.meta(key) == fb.meta(key));
  }
  CHECK(fa.meta("record.17.rollback").find("restored step 10; stop") != std::string::npos);

  // The case file: what fired, where, and the rows from the snapshot to the firing.
  const nlohmann::json doc = nlohmann::json::parse(slurp(report));
  REQUIRE(doc["cases"].size() == 1);
  const nlohmann::json& k = doc["cases"][0];
  CHECK(k["step"] == 17);
  CHECK(k["condition"] == "skip-rate");
  CHECK(k["restored_step"] == 10);
  CHECK(k["action"] == "stop");
  CHECK(k["rows"][0].get<std::string>().rfind("10,", 0) == 0);
  CHECK(k["rows"].size() == r.rows.size() - 10);
  // Resuming the restored checkpoint continues the run as if the bad stretch never ran.
  TrainConfig more = config();
  more.resume = ckpt;
  more.stop_at = 12;
  const TrainResult m = run(more);
  CHECK(m.rows.front().step == 10);
  for (auto& p : {ckpt, ref, csv, report}) std::remove(p.c_str());
}

TEST_CASE("a non-finite loss and a diverging loss each roll back", "[apps][rollback]") {
  TrainConfig n = config();
  n.rollback.on_nonfinite_loss = true;
  n.rollback.report = tmp("nonfinite.json");
  n.spikes[13] = 1e30f;  // (1e30)^2: the FP32 loss itself is inf
  const TrainResult rn = run(n);
  CHECK(rn.exit_code == 1);
  CHECK(rn.rollbacks == 1);
  CHECK(rn.final_next_step == 10);
  CHECK(nlohmann::json::parse(slurp(n.rollback.report))["cases"][0]["step"] == 13);

  TrainConfig d = config();
  d.dtype = DType::F32;
  d.rollback.on_divergence = true;
  d.rollback.divergence_warmup = 5;
  d.rollback.report = tmp("divergence.json");
  for (int64_t s = 20; s < 40; ++s) d.spikes[s] = 100.0f;  // the targets jump: the loss follows
  const TrainResult rd = run(d);
  CHECK(rd.exit_code == 1);
  CHECK(rd.rollbacks == 1);
  const nlohmann::json k = nlohmann::json::parse(slurp(d.rollback.report))["cases"][0];
  CHECK(k["condition"] == "divergence");
  CHECK(k["step"] >= 20);
  CHECK(k["restored_step"] <= 20);
  std::remove(n.rollback.report.c_str());
  std::remove(d.rollback.report.c_str());
}

TEST_CASE("rollback policies fp32 and lower-lr go on, marked in the log's policy column and the checkpoint",
          "[apps][rollback]") {
  const std::string csv = tmp("policy.csv"), ckpt = tmp("policy.safetensors"), report = tmp("policy.json");
  TrainConfig c = config();
  c.rollback.on_skip_rate = true;
  c.rollback.max_skip_rate = 0.3;
  c.rollback.policy = "fp32";
  c.csv = csv;
  c.checkpoint = ckpt;
  c.rollback.report = report;
  for (int64_t s = 12; s < 20; ++s) c.spikes[s] = 1e8f;  // overflows FP16's gradients, not FP32's (clipped)
  const TrainResult r = run(c);
  CHECK(r.exit_code == 0);
  CHECK(r.rollbacks == 1);
  CHECK(r.final_next_step == 40);
  const std::vector<std::string> lines = lines_of(csv);
  CHECK(lines[0] == std::string(kStepLogHeader) + ",policy");
  CHECK(lines[1].substr(lines[1].rfind(',') + 1) == "fp16@lr=0.01");
  CHECK(lines.back().substr(lines.back().rfind(',') + 1) == "fp32@lr=0.01");
  // The replayed steps after the restore: none skipped in FP32.
  size_t replay = 0;
  while (r.rows[replay + 1].step > r.rows[replay].step) ++replay;
  ++replay;
  CHECK(r.rows[replay].step == 10);
  for (size_t i = replay; i < r.rows.size(); ++i) CHECK_FALSE(r.rows[i].skipped);
  const SafetensorsFile f = read_safetensors(ckpt);
  CHECK(f.meta("setting.dtype") == "fp32");
  bool recorded = false;
  for (auto& [k, v] : f.metadata()) recorded |= k.rfind("record.", 0) == 0 && v.find("continue in fp32 (was fp16)") != std::string::npos;
  CHECK(recorded);

  TrainConfig l = config();
  l.rollback.on_skip_rate = true;
  l.rollback.max_skip_rate = 0.3;
  l.rollback.policy = "lower-lr";
  l.rollback.lr_factor = 0.5f;
  l.rollback.max_rollbacks = 1;
  l.rollback.report = report;
  for (int64_t s = 12; s < 40; ++s) l.inject_inf.insert(s);  // injected again after the restore
  const TrainResult rl = run(l);
  CHECK(rl.rollbacks == 2);  // the second one is past --max-rollbacks: stop
  CHECK(rl.exit_code == 1);
  CHECK(nlohmann::json::parse(slurp(report))["cases"][0]["action"] == "continue with lr 0.005 (was 0.01)");
  // The LR after the restore is the schedule's at the same position with half the peak.
  size_t i = 1;
  while (rl.rows[i].step > rl.rows[i - 1].step) ++i;
  CHECK(rl.rows[i].step == 10);
  CHECK(rl.rows[i].lr == Approx(0.5 * rl.rows[10].lr).epsilon(1e-6));
  for (auto& p : {csv, ckpt, report}) std::remove(p.c_str());
}

TEST_CASE("with rollback on but never firing, the log is byte for byte the plain run's", "[apps][rollback]") {
  const std::string plain = tmp("plain.csv"), watched = tmp("watched.csv");
  TrainConfig a = config();
  a.csv = plain;
  a.inject_inf = {7};
  run(a);
  TrainConfig b = a;
  b.csv = watched;
  b.rollback.on_skip_rate = b.rollback.on_nonfinite_loss = b.rollback.on_divergence = true;
  b.rollback.report = tmp("never.json");
  const TrainResult r = run(b);
  CHECK(r.rollbacks == 0);
  CHECK(slurp(plain) == slurp(watched));
  CHECK(lines_of(watched)[0] == kStepLogHeader);
  CHECK(access(b.rollback.report.c_str(), F_OK) != 0);  // nothing fired, no case file
  for (auto& p : {plain, watched}) std::remove(p.c_str());
}

TEST_CASE("resuming under another dtype is refused unless it is a new experiment, which is recorded",
          "[apps][rollback][checkpoint]") {
  const std::string ckpt = tmp("exp.safetensors"), next = tmp("exp2.safetensors");
  TrainConfig c = config();
  c.stop_at = 8;
  c.checkpoint = ckpt;
  run(c);
  const std::string before = slurp(ckpt);
  TrainConfig bf = config();
  bf.dtype = DType::BF16;
  bf.resume = ckpt;
  bf.checkpoint = next;
  bf.stop_at = 12;
  CHECK_THROWS_WITH(run(bf), Catch::Contains("--dtype fp16") && Catch::Contains("--dtype bf16") &&
                                 Catch::Contains("--new-experiment"));
  CHECK(slurp(ckpt) == before);
  CHECK(access(next.c_str(), F_OK) != 0);
  // Another non-policy setting stays refused even for a new experiment.
  TrainConfig other = bf;
  other.new_experiment = true;
  other.lr = 0.5f;
  CHECK_THROWS_WITH(run(other), Catch::Contains("lr=") && Catch::Contains("resume with the same settings"));
  bf.new_experiment = true;
  std::string printed;
  bf.quiet = false;
  const TrainResult r = run(bf, &printed);
  CHECK(r.exit_code == 0);
  CHECK(r.rows.front().step == 8);
  CHECK(r.rows.front().scaler_scale == 1.0f);  // bf16: no loss scaling, the fp16 scale is not carried over
  CHECK_THAT(printed, Catch::Contains("experiment: new experiment at step 8 from '" + ckpt + "': dtype fp16 -> bf16"));
  const SafetensorsFile f = read_safetensors(next);
  CHECK(f.meta("setting.dtype") == "bf16");
  CHECK_THAT(f.meta("experiment"), Catch::Contains("dtype fp16 -> bf16") && Catch::Contains("scaler 1 -> 0"));
  for (auto& p : {ckpt, next}) std::remove(p.c_str());
}
