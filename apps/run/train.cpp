// The options of a training run (TrainConfig), checked in one place: check_train_config() says the
// first bad option, one error each, before anything is built. The run itself: apps/run/trainer.cpp.
#include "apps/run/train.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "amp/dist/communicator.h"
#include "apps/run/model_kinds.h"
#include "apps/run/rollback.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

int TrainConfig::world_size() const { return comm ? comm->world_size() : 1; }

std::string short_count(double n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  return buf;
}

double parameter_count_of(const TrainConfig& c) { return model_kind(c.model).parameter_count(c); }

bool parse_grad_dtype(const std::string& word) {
  if (word == "compute") return true;
  if (word != "fp32") throw UsageError("unknown --grad-dtype '" + word + "': use fp32 or compute");
  return false;
}

ClipMode parse_clip_mode(const std::string& word) {
  if (word == "value") return ClipMode::Value;
  if (word != "norm") throw UsageError("unknown --clip-mode '" + word + "': use norm or value");
  return ClipMode::Norm;
}

void parse_rollback_on(const std::vector<std::string>& words, RollbackOptions& rollback) {
  for (const std::string& r : words) {
    if (r == "skip-rate") rollback.on_skip_rate = true;
    else if (r == "nonfinite-loss") rollback.on_nonfinite_loss = true;
    else if (r == "divergence") rollback.on_divergence = true;
    else throw UsageError("unknown --rollback-on '" + r + "': use skip-rate, nonfinite-loss or divergence");
  }
}

namespace {

// The sizes and the batch, and how the batch splits into micro-batches and ranks.
void validate_sizes(const TrainConfig& c) {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw UsageError(std::string("--") + name + " must be positive, got " + std::to_string(v));
  };
  positive("in", c.in_features);
  positive("out", c.out_features);
  positive("batch", c.batch);
  positive("steps", c.steps);
  // The device keeps the applied-step count in FP32, exact up to 2^24.
  if (c.steps > (int64_t{1} << 24)) throw UsageError("--steps must be at most 16777216, got " + std::to_string(c.steps));
  if (c.micro_batch < 0) throw UsageError("--micro-batch must be positive, got " + std::to_string(c.micro_batch));
  if (c.batch % c.world_size() != 0)
    throw UsageError("--batch " + std::to_string(c.batch) + " is not a multiple of the world size " +
                     std::to_string(c.world_size()) + " (--batch is the effective batch, split across ranks)");
  if (c.micro_batch > 0 && c.local_batch() % c.micro_batch != 0)
    throw UsageError("--batch " + std::to_string(c.batch) + " is not a multiple of --micro-batch " +
                     std::to_string(c.micro_batch) +
                     (c.world_size() > 1 ? " x the world size " + std::to_string(c.world_size()) : std::string()));
}

// --shard-optimizer: what the sharded step supports (each refusal one line; SafeStep checks
// the step's own options again for a library caller).
void validate_sharding(const TrainConfig& c) {
  if (!c.comm || (c.comm->name() != "mpi" && c.comm->name() != "nccl"))
    throw UsageError("--shard-optimizer needs --dist mpi or --dist nccl (started by mpirun)");
  if (c.optimizer != "adamw")
    throw UsageError("--shard-optimizer shards AdamW's state; --optimizer " + c.optimizer + " is not supported with it");
  if (!c.fused || c.clip_mode == ClipMode::Value || !c.census.empty())
    throw UsageError("--shard-optimizer needs the fused step clipping by norm: drop --unfused, --clip-mode value and "
                     "--census");
}

// --dist: what a distributed run does not support yet, and which communicator fits the device.
void validate_dist(const TrainConfig& c) {
  if (c.world_size() > 1) {
    // Anomaly mode stops one rank at its first non-finite value, leaving its peers in a collective.
    if (c.detect_anomaly) throw UsageError("--detect-anomaly is single-process only for now; drop it with --dist");
    // Its snapshots and report are per process, not yet agreed across ranks.
    if (c.rollback.enabled()) throw UsageError("--rollback-on is single-process only for now; drop it with --dist");
  }
  if (c.comm) validate_dist_device(c.comm->name(), c.device);
  if (c.shard_optimizer) validate_sharding(c);
  if (c.inject_rank >= c.world_size())
    throw UsageError("--inject-rank " + std::to_string(c.inject_rank) + " is not a rank of this run (world size " +
                     std::to_string(c.world_size()) + ")");
}

// The model: its kind, the options given for it, its own checks, and the held-out evaluation.
void validate_model(const TrainConfig& c) {
  const ModelKind& kind = model_kind(c.model);
  check_given_options(kind, c.given);
  kind.check(c);
  if (c.eval_every < 0) throw UsageError("--eval-every must be >= 0, got " + std::to_string(c.eval_every));
  if (c.eval_windows <= 0) throw UsageError("--eval-windows must be positive, got " + std::to_string(c.eval_windows));
  if (c.eval_every > 0 && !kind.token_data) throw UsageError("--eval-every needs a model of token data (held-out text)");
}

// The optimizer and its learning-rate schedule.
void validate_optimizer(const TrainConfig& c) {
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    throw UsageError("unknown optimizer '" + c.optimizer + "': use adamw or sgd");
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr)) throw UsageError("--lr must be a positive number");
  if (!(c.weight_decay >= 0.0f)) throw UsageError("--weight-decay must be >= 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) throw UsageError("--momentum must be in [0, 1)");
  if (c.warmup < 0) throw UsageError("--warmup must be >= 0");
  // A warmup the schedule ignores, or one that never ends, would run without a word.
  if (c.warmup > 0 && c.schedule == "constant")
    throw UsageError("--warmup " + std::to_string(c.warmup) + " needs --schedule cosine (the constant schedule has no warmup)");
  if (c.schedule == "cosine" && c.warmup >= c.steps)
    throw UsageError("--warmup " + std::to_string(c.warmup) + " is as long as the run (--steps " +
                     std::to_string(c.steps) + "): the learning rate would never leave warmup; give a warmup below --steps");
}

// Clipping, checkpoints, the planted faults (--inject-inf, --spike) and rollback.
void validate_belts(const TrainConfig& c) {
  if (std::isnan(c.max_norm) || c.max_norm <= 0.0f) throw UsageError("--clip must be > 0");
  if (c.clip_mode == ClipMode::Value && std::isinf(c.max_norm))
    throw UsageError("--clip-mode value needs --clip VALUE (the bound each gradient element is clamped to)");
  if (c.checkpoint_every < 0) throw UsageError("--checkpoint-every must be >= 0");
  if (c.stop_at < -1) throw UsageError("--stop-at must be >= 0");
  if (c.checkpoint_every > 0 && c.checkpoint.empty()) throw UsageError("--checkpoint-every needs --checkpoint FILE");
  for (int64_t s : c.inject_inf)
    if (s < 0) throw UsageError("--inject-inf step must be >= 0, got " + std::to_string(s));
  for (auto [s, f] : c.spikes)
    if (s < 0 || !std::isfinite(f)) throw UsageError("--spike needs STEP >= 0 and a finite FACTOR");
  validate_rollback(c.rollback);
  if (c.rollback.policy == "fp32" && c.dtype == DType::F32)
    throw UsageError("--rollback-policy fp32 on an fp32 run changes nothing: use lower-lr F, or the default stop");
}

}  // namespace

void validate_dist_device(const std::string& dist, const std::string& device) {
  if (dist == "mpi" && device != "cpu") throw UsageError("--dist mpi trains on --device cpu; use --dist nccl for GPUs");
  if (dist == "nccl" && device == "cpu")
    throw UsageError("--dist nccl trains on GPU tensors: add --device cuda (or use --dist mpi on the CPU)");
}

void check_train_config(const TrainConfig& c) {
  if (c.census_every < 1) throw UsageError("--census-every must be >= 1, got " + std::to_string(c.census_every));
  if (!c.census.empty() && (!c.fused || c.clip_mode == ClipMode::Value))
    throw UsageError("--census is taken by the fused guard: drop --unfused and --clip-mode value");
  if (c.census_casts && c.census.empty()) throw UsageError("--census-casts counts into the census file: add --census FILE");
  validate_sizes(c);
  validate_dist(c);
  validate_model(c);
  validate_optimizer(c);
  validate_belts(c);
  // A size that cannot even be counted in bytes is bad input, not an out-of-memory.
  if (parameter_count_of(c) * 16.0 > 9.0e18)
    throw UsageError("the model would have " + short_count(parameter_count_of(c)) + " parameters: too many to address");
  if (static_cast<double>(c.batch) * static_cast<double>(c.in_features + c.out_features) * 4.0 > 9.0e18)
    throw UsageError("a batch of " + std::to_string(c.batch) + " rows is too large to address");
  parse_schedule(c.schedule, c.lr, c.warmup, c.steps);
  const Device device = parse_device(c.device);
  require_device(device);
}

std::unique_ptr<Module> make_model(const TrainConfig& c, Rng& rng, Device device) {
  return model_kind(c.model).build(c, rng, device);
}

}  // namespace belay
