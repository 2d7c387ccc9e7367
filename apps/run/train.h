// `belay train`'s options (TrainConfig) and what a run returns (TrainResult). The run
// itself is a Trainer (apps/run/trainer.h): a model, an optimizer, a scaler, SafeStep, a dataset
// (seeded synthetic or the user's file), the step log, checkpoints, and a progress display.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/safe_step.h"
#include "amp/scale_monitor.h"
#include "amp/step_log.h"
#include "apps/run/rollback.h"
#include "autograd/anomaly.h"
#include "engine/dtype.h"

namespace belay {

class Dataset;
class Communicator;

struct TrainConfig {
  std::string model = "linear";  // a kind of apps/run/model_kinds.h: linear | mlp | gpt
  int64_t in_features = 64;      // with --data: taken from the file
  int64_t out_features = 8;      // with --data: taken from the file
  int64_t hidden = 64;
  int layers = 2;                // mlp: linear layers; gpt: blocks
  // --model gpt (autograd/gpt.h) on a tokens file (--data; apps/run/token_dataset.h): the width
  // of the residual stream, the heads, and the context (tokens per sequence; --batch counts
  // sequences). The vocabulary is the file's.
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 64;
  // Held-out loss (token data): after every eval_every-th step and the last, the mean loss
  // over the first eval_windows held-out windows, in the CSV's `heldout_loss` column and the
  // summary. 0: never (the CSV keeps its 8 columns).
  int64_t eval_every = 0;
  int64_t eval_windows = 64;
  // GPT: "fused" (Backend::attention: no [T, T] scores kept) or "naive" (bmm, causal softmax, bmm).
  std::string attention = "fused";
  // GPT: the MLP's GELU, "erf" (exact, PyTorch's default) or "tanh" (GPT-2's gelu_new).
  std::string gelu = "erf";
  int64_t batch = 32;        // samples per optimizer step (the effective batch)
  int64_t micro_batch = 0;   // samples per forward/backward; 0: the whole batch
  int64_t steps = 200;       // the run's total, also when resuming
  uint64_t seed = 0;
  std::string optimizer = "adamw";  // adamw | sgd
  float lr = 1e-2f;
  float weight_decay = 0.0f;
  float momentum = 0.9f;
  std::string schedule = "constant";  // constant | cosine
  int64_t warmup = 0;
  DType dtype = DType::F32;
  std::string device = "cpu";
  bool low_precision_grads = false;  // weight gradients in the compute dtype
  float max_norm = std::numeric_limits<float>::infinity();  // --clip: the norm, or the value bound
  ClipMode clip_mode = ClipMode::Norm;
  bool fused = true;
  GradScalerOptions scaler;
  bool scaler_explicit = false;  // --scaler/--no-scaler given; otherwise on for fp16 only
  std::set<int64_t> inject_inf;          // steps whose gradient gets an inf
  int inject_rank = -1;                  // --inject-rank: only this rank plants it; < 0: every rank
  // Data parallelism (--dist mpi): nullptr is one process. Each rank trains on its slice of
  // every effective batch; --batch stays the effective batch (micro x accum x world size).
  Communicator* comm = nullptr;
  // --shard-optimizer (ZeRO stage 1): each rank keeps and updates the AdamW state of its share
  // of the parameters (amp/dist/shard_plan.h); not a setting: a checkpoint resumes either way.
  bool shard_optimizer = false;
  std::map<int64_t, float> spikes;       // step -> factor multiplying that batch's targets
  std::string csv;                       // empty: no log file
  // --census FILE: the fused guard's per-gradient census (engine/census.h) of every
  // census_every-th step and of every skipped step, as CSV (amp/census_log.h); the step
  // log gets the column nonfinite_tensors and the summary the census's advice.
  std::string census;
  int64_t census_every = 1;
  // --census-casts: the census of the forward's casts too (autograd/cast_census.h), rows
  // "cast:<site>" of the census file.
  bool census_casts = false;
  // --tensorboard DIR: the step log's values (and the census's, with --census) as TensorBoard
  // scalars, in an event file of DIR (apps/run/tensorboard_events.h).
  std::string tensorboard;
  std::string data;                      // safetensors with x and y; empty: synthetic
  std::string init;                      // safetensors with initial weights
  std::string checkpoint;                // written every checkpoint_every steps and on SIGINT/SIGTERM
  int64_t checkpoint_every = 0;          // 0: only at the end and on a signal
  std::string resume;                    // checkpoint to continue from
  int64_t stop_at = -1;                  // stop (checkpointing) once this many steps are done; < 0: never
  SkipMonitorOptions skip;
  RollbackOptions rollback;  // --rollback-on ...: keep the last good state, return to it
  bool show_steps = false;  // print every row, labelled STEP or SKIP
  // Wait for each step's row before the next step (as a loop that reads found_inf on the
  // host does), instead of reading it one step late: to measure what that costs on a GPU.
  bool sync_each_step = false;
  bool quiet = false;
  bool handle_signals = false;  // the CLI: SIGINT/SIGTERM finish the step, checkpoint, exit 130/143
  // Polled between steps when set (the Python module: Ctrl-C as PyErr_CheckSignals sees it): a
  // nonzero signal number stops the run after the step as that signal does with handle_signals.
  std::function<int()> stop_requested;
  // --detect-anomaly: stop at the first non-finite value (autograd/anomaly.h) with a report,
  // thrown as AnomalyError; a scaled gradient's overflow is reported as a scaler event.
  bool detect_anomaly = false;
  uint32_t fp32_ops = 0;        // --fp32-ops: op classes autocast leaves in FP32 (amp/autocast.h)
  bool new_experiment = false;  // --new-experiment: resume under another precision policy (dtype, ops), recorded
  // The options the user gave (names without dashes: "lr", "weight-decay"): the model kind's
  // defaults fill the others, and an option of another kind is refused (model_kinds.h).
  std::set<std::string> given;
  // A dataset supplied by the caller (belay validate --train), used instead of --data or
  // the synthetic one; called once per run.
  std::function<std::unique_ptr<Dataset>()> make_dataset;

  int world_size() const;  // 1 without a communicator
  int64_t local_batch() const { return batch / world_size(); }  // this rank's slice
  int64_t accum_steps() const { return micro_batch > 0 ? local_batch() / micro_batch : 1; }
  int64_t micro_batch_size() const { return micro_batch > 0 ? micro_batch : local_batch(); }
};

struct TrainResult {
  int exit_code = 0;  // 0; 1 when the skip-rate stop or a stopping rollback fired; 130/143 after SIGINT/SIGTERM
  std::string stop_reason;  // with exit_code 1: why, the line printed after "belay: error: "
  std::vector<StepRow> rows;  // the rows this invocation ran
  float first_loss = 0.0f;
  float final_loss = 0.0f;  // last applied step's loss
  int64_t skipped = 0;
  double seconds = 0.0;
  std::vector<double> step_ms;      // wall time of each step
  int64_t gradient_syncs = 0;
  int64_t gradient_bytes = 0;  // sent into gradient all-reduces by this rank (0 in one process)
  int64_t gradient_buckets = 0;        // bucket all-reduces started by this rank
  // Per step: the buckets whose reduction had completed when backward ended (the overlap).
  std::vector<int64_t> buckets_done_in_backward;
  double gradient_sync_seconds = 0.0;  // host time in the gradient sync, this rank
  double gradient_wait_seconds = 0.0;  // ... of which waiting for reductions to complete
  std::vector<float> final_weights;  // every master, flattened, for tests
  int64_t rollbacks = 0;             // conditions that fired (each restored the last good state)
  ScalerState final_scaler;          // the state at the end (after a stopping rollback: the restored one)
  int64_t final_optimizer_steps = 0;
  int64_t final_next_step = 0;
  std::string final_data_position;
  ScaleSummary scale;                // the loss scale over this invocation's rows
  int64_t clipped = 0;               // applied steps whose gradient the clip changed
  float min_clip_cosine = 1.0f;      // over those steps (1 under norm clipping)
  double mean_clip_cosine = 1.0;
  std::vector<AnomalyReport> scaler_events;  // --detect-anomaly with loss scaling
  std::vector<std::pair<int64_t, double>> heldout;  // (step, held-out loss) of each evaluation
  double unigram_entropy = 0.0;      // token data: the training split's, in nats (the loss to beat)
  // Token data: bytes of text per held-out target token (0: unknown), so that a held-out loss
  // L nats per token is L / ln 2 / this bits per byte (TokenDataset::heldout_bytes_per_token).
  double heldout_bytes_per_token = 0.0;
  int64_t tokens_per_step = 0;       // token data: batch x context
};

// Every option checked, in one place: throws UsageError naming the first bad one.
void check_train_config(const TrainConfig& config);
// Which --dist fits which --device (part of validate). The CLI asks it before it makes the
// communicator too: a refused pairing then stops before MPI or NCCL starts.
void validate_dist_device(const std::string& dist, const std::string& device);
// Options a user writes as words, read once for the CLI and the Python module alike
// (apps/run/train_options.cpp); a bad word is a UsageError naming the option as the CLI
// spells it.
bool parse_grad_dtype(const std::string& word);  // true: "compute", false: "fp32"
ClipMode parse_clip_mode(const std::string& word);
// skip-rate, nonfinite-loss, divergence: each turns its condition on.
void parse_rollback_on(const std::vector<std::string>& words, RollbackOptions& rollback);
// The model's parameter count by the config, in double (it is checked before it is built).
double parameter_count_of(const TrainConfig& c);
std::string short_count(double n);  // "%.3g": a count or a size in a message
// The model a run starts from: c.model's kind (apps/run/model_kinds.h) with c's shape,
// initialised from `rng` (seeded by c.seed).
class Module;
class Rng;
std::unique_ptr<Module> make_model(const TrainConfig& c, Rng& rng, Device device);
// The whole run: Trainer(config, out).run() (apps/run/trainer.h).
TrainResult run_training(const TrainConfig& config, std::ostream& out);

// `belay train --scenario broken-batch`: how one bad batch freezes Adam without clipping.
int run_broken_batch(std::ostream& out);

// For tests of the signal path: behave as if SIGINT/SIGTERM arrived (0 clears).
void request_stop(int signal_number);

}  // namespace belay
