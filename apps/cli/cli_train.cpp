// `belay train`: its option table, and the parsed options turned into a TrainConfig (each
// bad value one UsageError) and a run of the training library.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <iostream>

#include "amp/autocast.h"
#include "apps/cli/cli.h"
#include "apps/run/trainer.h"
#include "engine/error.h"

namespace belay {
namespace {

std::pair<int64_t, float> parse_spike(const std::string& s) {
  const auto colon = s.find(':');
  if (colon == std::string::npos) throw UsageError("--spike expects STEP:FACTOR, got '" + s + "'");
  try {
    size_t used = 0;
    const long long step = std::stoll(s.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("step");
    const std::string f = s.substr(colon + 1);
    const float factor = std::stof(f, &used);
    if (used != f.size()) throw std::invalid_argument("factor");
    return {step, factor};
  } catch (const std::logic_error&) {
    throw UsageError("--spike expects STEP:FACTOR (e.g. 12:1e8), got '" + s + "'");
  }
}

void add_model_options(CLI::App* train, TrainConfig& tc) {
  train->add_option("--model", tc.model, "linear | mlp | gpt (a small transformer on a tokens file: --data)")->capture_default_str();
  train->add_option("--in", tc.in_features, "input features")->capture_default_str();
  train->add_option("--out", tc.out_features, "output features")->capture_default_str();
  train->add_option("--hidden", tc.hidden, "MLP hidden width")->capture_default_str();
  train->add_option("--layers", tc.layers, "MLP linear layers; GPT blocks")->capture_default_str();
  train->add_option("--width", tc.width, "GPT: width of the residual stream")->capture_default_str();
  train->add_option("--heads", tc.heads, "GPT: attention heads (they divide --width)")->capture_default_str();
  train->add_option("--context", tc.context, "GPT: tokens per sequence (--batch counts sequences)")->capture_default_str();
  train->add_option("--eval-every", tc.eval_every,
                    "GPT: held-out loss after every N steps and the last (CSV column heldout_loss); 0: never")
      ->capture_default_str();
  train->add_option("--eval-windows", tc.eval_windows, "GPT: held-out windows (of --context tokens) per evaluation")
      ->capture_default_str();
  train->add_option("--batch", tc.batch, "samples per optimizer step (the effective batch)")->capture_default_str();
  train->add_option("--micro-batch", tc.micro_batch,
                    "samples per forward/backward; gradients accumulate over batch/micro-batch of them");
  train->add_option("--steps", tc.steps, "optimizer steps (applied or skipped)")->capture_default_str();
  train->add_option("--seed", tc.seed, "seed of the weights and the data")->capture_default_str();
  train->add_option("--optimizer", tc.optimizer, "adamw | sgd")->capture_default_str();
  train->add_option("--lr", tc.lr, "peak learning rate")->capture_default_str();
  train->add_option("--weight-decay", tc.weight_decay, "decoupled (AdamW) or coupled (SGD) decay")->capture_default_str();
  train->add_option("--momentum", tc.momentum, "SGD momentum")->capture_default_str();
  train->add_option("--schedule", tc.schedule, "constant | cosine (linear warmup, then cosine to 0)")->capture_default_str();
  train->add_option("--warmup", tc.warmup, "warmup steps of the cosine schedule")->capture_default_str();
}

void add_precision_and_dist_options(CLI::App* train, TrainCommand& t) {
  TrainConfig& tc = t.config;
  train->add_option("--dtype", t.dtype, "fp32 | fp16 | bf16 (compute dtype; masters stay fp32)")->capture_default_str();
  train->add_option("--device", tc.device, "cpu | cuda[:N]")->capture_default_str();
  train->add_option("--grad-dtype", t.grad_dtype, "weight gradient buffers: fp32 | compute")->capture_default_str();
  train->add_option("--clip", tc.max_norm, "clip the global gradient L2 norm to this (default: measure only)");
  train->add_option("--clip-mode", t.clip_mode,
                    "norm: scale the gradient to --clip global L2 norm (direction kept); value: clamp each element "
                    "to [-clip, clip] (direction changes)")->capture_default_str();
  train->add_flag("--unfused", t.unfused, "PyTorch's order in separate passes (unscale_, clip_grad_norm_, step)");
  train->add_option("--inject-inf", t.inject, "plant an inf in a gradient at STEP (repeatable)");
  train->add_option("--inject-rank", tc.inject_rank, "with --dist: plant --inject-inf on this rank only (default: every rank)");
  train->add_option("--dist", t.dist,
                    "local | mpi (CPU) | nccl (GPU): one process per rank, started by mpirun -np N")->capture_default_str();
  train->add_flag("--dist-progress-thread", t.progress_thread,
                  "with --dist mpi: a thread moves the gradient buckets while backward computes (MPI moves them "
                  "only when called)");
  train->add_option("--bucket-mb", t.bucket_mb,
                    "with --dist: gradients travel in buckets of about this many MB (FP32), each started while "
                    "backward still runs; 0: one bucket")->capture_default_str();
  train->add_option("--dist-timeout", t.dist_timeout,
                    "with --dist: seconds a rank waits for its peers in a collective before it stops every rank "
                    "with an error (a rank died or hangs)")->capture_default_str();
  train->add_option("--spike", t.spikes, "STEP:FACTOR multiplies that batch's targets, e.g. 12:1e8 (repeatable)");
  train->add_option("--csv", tc.csv, "per-step log: step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale");
}

void add_scaler_and_rollback_options(CLI::App* train, TrainCommand& t) {
  TrainConfig& tc = t.config;
  train->add_flag("--scaler", t.scaler_on, "dynamic loss scaling on (default: on for fp16 only)");
  train->add_flag("--no-scaler", t.no_scaler, "dynamic loss scaling off");
  train->add_option("--init-scale", tc.scaler.init_scale, "initial loss scale")->capture_default_str();
  train->add_option("--growth-factor", tc.scaler.growth_factor, "scale growth factor")->capture_default_str();
  train->add_option("--backoff-factor", tc.scaler.backoff_factor, "scale backoff factor")->capture_default_str();
  train->add_option("--growth-interval", tc.scaler.growth_interval, "clean steps before growth")->capture_default_str();
  train->add_option("--hysteresis", tc.scaler.hysteresis, "overflows tolerated before backing off")->capture_default_str();
  train->add_option("--min-scale", tc.scaler.min_scale, "lowest loss scale")->capture_default_str();
  train->add_option("--max-scale", tc.scaler.max_scale, "highest loss scale")->capture_default_str();
  train->add_option("--skip-window", tc.skip.window, "steps the rolling skip rate is taken over")->capture_default_str();
  train->add_option("--skip-alert", tc.skip.alert_rate, "print an alert when the skip rate passes this")->capture_default_str();
  train->add_option("--max-skip-rate", tc.skip.max_rate, "stop (exit 1) when the skip rate stays above this ...");
  train->add_option("--skip-patience", tc.skip.patience, "... for this many consecutive steps")->capture_default_str();
  train->add_option("--rollback-on", t.rollback_on,
                    "keep the last good state and return to it when skip-rate, nonfinite-loss or divergence fires "
                    "(comma-separated or repeated)")->delimiter(',');
  train->add_option("--rollback-policy", t.rollback_policy,
                    "after a rollback: stop (default, exit 1), fp32 (go on with autocast off) or lower-lr F (go on "
                    "with the LR times F)")->expected(1, 2);
  train->add_option("--rollback-every", tc.rollback.every, "take a new good state at most every N steps")->capture_default_str();
  train->add_option("--rollback-skip-window", tc.rollback.skip_window, "skip-rate: the steps counted")->capture_default_str();
  train->add_option("--rollback-skip-rate", tc.rollback.max_skip_rate,
                    "skip-rate: fires when more than this fraction of the window is skipped")->capture_default_str();
  train->add_option("--divergence-factor", tc.rollback.divergence_factor,
                    "divergence: fires when the smoothed loss (EMA 0.1) exceeds this times its best")->capture_default_str();
  train->add_option("--divergence-warmup", tc.rollback.divergence_warmup,
                    "divergence: applied steps before the best smoothed loss counts")->capture_default_str();
  train->add_option("--max-rollbacks", tc.rollback.max_rollbacks, "with fp32/lower-lr: stop after this many")->capture_default_str();
  train->add_option("--rollback-report", tc.rollback.report,
                    "the case file (JSON; default: the CSV's name with .rollback.json, or rollback.json)");
}

void add_file_and_display_options(CLI::App* train, TrainCommand& t) {
  TrainConfig& tc = t.config;
  train->add_option("--data", tc.data, "safetensors file with x [N, in] and y [N, out] (or I64 labels [N])");
  train->add_option("--init", tc.init, "safetensors file with initial weights (state-dict names)");
  train->add_option("--checkpoint", tc.checkpoint, "checkpoint file, written atomically at the end and on SIGINT/SIGTERM");
  train->add_option("--checkpoint-every", tc.checkpoint_every, "also write it every N steps");
  train->add_option("--resume", tc.resume, "continue from this checkpoint, up to --steps in all");
  train->add_option("--stop-at", tc.stop_at, "stop after this many steps of the run (checkpointing), to resume later");
  train->add_flag("--show-steps", tc.show_steps, "print every step: STEP or SKIP, reason, norms, scale");
  train->add_flag("--sync-each-step", tc.sync_each_step,
                  "wait for each step's log row before the next step (default: read one step late)");
  train->add_flag("--quiet", tc.quiet, "print nothing but errors");
  train->add_option("--scenario", t.scenario, "broken-batch: how one bad batch freezes unclipped Adam");
  train->add_flag("--detect-anomaly", tc.detect_anomaly,
                  "stop at the first non-finite value (input, an op's output, the loss, a gradient, the optimizer's "
                  "result) with a report; reads every tensor on the host (slow)");
  train->add_option("--fp32-ops", t.fp32_ops, "op classes autocast leaves in FP32, e.g. linear,gelu");
  train->add_flag("--new-experiment", tc.new_experiment,
                  "allow --resume under another precision policy (--dtype, --grad-dtype, loss scaling, --fp32-ops): "
                  "a new experiment from the checkpoint, recorded in it");
}

// --rollback-on and --rollback-policy, from their words.
void set_rollback(const TrainCommand& t, RollbackOptions& rb) {
  parse_rollback_on(t.rollback_on, "--rollback-on", rb);
  if (t.rollback_policy.empty()) return;
  rb.policy = t.rollback_policy[0];
  if (rb.policy == "lower-lr") {
    if (t.rollback_policy.size() != 2) throw UsageError("--rollback-policy lower-lr needs a factor F, e.g. lower-lr 0.1");
    char* end = nullptr;
    rb.lr_factor = std::strtof(t.rollback_policy[1].c_str(), &end);
    if (*end != '\0' || t.rollback_policy[1].empty())
      throw UsageError("--rollback-policy lower-lr F: '" + t.rollback_policy[1] + "' is not a number");
  } else if (t.rollback_policy.size() != 1) {
    throw UsageError("--rollback-policy " + rb.policy + " takes no value");
  }
}

// The options given as words (dtype, scaler flags, clip mode, faults) into the config.
void set_precision(TrainCommand& t) {
  TrainConfig& tc = t.config;
  if (t.no_scaler && t.scaler_on) throw UsageError("--scaler and --no-scaler contradict each other");
  tc.dtype = parse_dtype(t.dtype);
  tc.low_precision_grads = parse_grad_dtype(t.grad_dtype, "--grad-dtype");
  tc.scaler_explicit = t.no_scaler || t.scaler_on;
  tc.scaler.enabled = t.scaler_on || (!t.no_scaler && tc.dtype == DType::F16);
  tc.fused = !t.unfused;
}

// --dist: the communicator and its settings; without it, a run under mpirun is refused.
void set_dist(TrainCommand& t, std::unique_ptr<Communicator>& comm) {
  if (t.dist != "local") {
    validate_dist_device(t.dist, t.config.device);  // before MPI's (and NCCL's) init
    comm = make_communicator(t.dist);
    t.config.comm = comm.get();
    if (!(t.bucket_mb >= 0.0 && t.bucket_mb <= 1.0e6))
      throw UsageError("--bucket-mb must be between 0 (one bucket) and 1e6, got " + CLI::detail::to_string(t.bucket_mb));
    if (!(t.dist_timeout > 0.0 && t.dist_timeout <= 1.0e7))
      throw UsageError("--dist-timeout must be a positive number of seconds, got " + CLI::detail::to_string(t.dist_timeout));
    comm->set_bucket_bytes(static_cast<size_t>(t.bucket_mb * 1048576.0));
    comm->set_timeout_seconds(t.dist_timeout);
    comm->set_progress_thread(t.progress_thread);
    comm->connect();  // NCCL's init, bounded by --dist-timeout
  } else if (t.progress_thread) {
    throw UsageError("--dist-progress-thread needs --dist mpi");
  } else if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoi(n) > 1) {
    // Each process would train alone and all would write the same CSV and checkpoint.
    throw UsageError(std::string("started by mpirun with ") + n +
                     " processes but without --dist mpi: add it (or run one process)");
  }
}

// The tokens file the build makes (the belay_text_corpus target, which apps/belay.sh builds):
// data/text.safetensors beside the executable. Empty when it is not there: the run then says
// how to make one.
std::string default_tokens_path() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path file = exe.parent_path() / "data" / "text.safetensors";
  return std::filesystem::exists(file, ec) ? file.string() : "";
}

}  // namespace

void add_train_command(CLI::App& app, TrainCommand& t) {
  t.app = app.add_subcommand("train", "train a Linear model (or an MLP) on seeded synthetic data");
  add_model_options(t.app, t.config);
  add_precision_and_dist_options(t.app, t);
  add_scaler_and_rollback_options(t.app, t);
  add_file_and_display_options(t.app, t);
}

int run_train_command(TrainCommand& t, std::unique_ptr<Communicator>& comm) {
  if (!t.scenario.empty()) {
    if (t.scenario != "broken-batch") throw UsageError("unknown scenario '" + t.scenario + "': use broken-batch");
    return run_broken_batch(std::cout);
  }
  TrainConfig& tc = t.config;
  std::set<std::string> given;
  for (const CLI::Option* o : t.app->get_options())
    if (o->count() > 0) given.insert(o->get_lnames().begin(), o->get_lnames().end());  // "lr", "weight-decay"
  apply_gpt_defaults(tc, given);
  if (tc.model == "gpt" && tc.data.empty()) tc.data = default_tokens_path();
  set_precision(t);
  set_rollback(t, tc.rollback);
  tc.clip_mode = parse_clip_mode(t.clip_mode, "--clip-mode");
  tc.fp32_ops = parse_fp32_ops(t.fp32_ops);
  tc.inject_inf.insert(t.inject.begin(), t.inject.end());
  for (const std::string& s : t.spikes) tc.spikes.insert(parse_spike(s));
  tc.handle_signals = true;
  set_dist(t, comm);
  return Trainer(tc, std::cout).run().exit_code;
}

}  // namespace belay
