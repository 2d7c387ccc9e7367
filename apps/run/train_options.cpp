// The table of `belay train`'s options (apps/run/train_options.h) and the one reading of the
// options given as words. The order is --help's.
#include "apps/run/train_options.h"

#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "amp/autocast.h"
#include "apps/run/model_kinds.h"
#include "engine/error.h"
#include "engine/text_fields.h"

namespace belay {

namespace {

// Where a row's value lands: a field of TrainOptions (or of its config), as a function.
// --model's help: the kinds of the model-kind table, and what the notes of some say.
std::string model_option_help() {
  std::string names, notes;
  for (const ModelKind& k : model_kinds()) {
    names += (names.empty() ? "" : " | ") + std::string(k.name);
    if (k.note) notes += (notes.empty() ? " (" : "; ") + std::string(k.note);
  }
  return names + (notes.empty() ? "" : notes + ")");
}

#define BELAY_FIELD(member) +[](TrainOptions& o) -> auto& { return o.member; }

// Built on first use, after the model-kind table (--model's help reads it).
std::vector<TrainOption> make_train_options() {
  return {
    // The model and the run's length.
    {"model", BELAY_FIELD(config.model), model_option_help(), kShowDefault},
    {"in", BELAY_FIELD(config.in_features), "input features", kShowDefault, "in_features"},
    {"out", BELAY_FIELD(config.out_features), "output features", kShowDefault, "out_features"},
    {"hidden", BELAY_FIELD(config.hidden), "MLP hidden width", kShowDefault},
    {"layers", BELAY_FIELD(config.layers), "MLP linear layers; GPT blocks", kShowDefault},
    {"width", BELAY_FIELD(config.width), "GPT: width of the residual stream", kShowDefault},
    {"heads", BELAY_FIELD(config.heads), "GPT: attention heads (they divide --width)", kShowDefault},
    {"context", BELAY_FIELD(config.context), "GPT: tokens per sequence (--batch counts sequences)", kShowDefault},
    {"eval-every", BELAY_FIELD(config.eval_every),
     "GPT: held-out loss after every N steps and the last (CSV column heldout_loss); 0: never", kShowDefault},
    {"eval-windows", BELAY_FIELD(config.eval_windows), "GPT: held-out windows (of --context tokens) per evaluation",
     kShowDefault},
    {"attention", BELAY_FIELD(config.attention),
     "GPT: fused (one kernel, FlashAttention-2's: never the T x T scores) | naive (bmm, causal softmax, bmm: the "
     "reference)",
     kShowDefault},
    {"gelu", BELAY_FIELD(config.gelu),
     "GPT: the MLP's GELU: erf (exact, PyTorch's default) | tanh (GPT-2's own, Hugging Face's gelu_new)",
     kShowDefault},
    {"batch", BELAY_FIELD(config.batch), "samples per optimizer step (the effective batch)", kShowDefault},
    {"micro-batch", BELAY_FIELD(config.micro_batch),
     "samples per forward/backward; gradients accumulate over batch/micro-batch of them"},
    {"steps", BELAY_FIELD(config.steps), "optimizer steps (applied or skipped)", kShowDefault},
    {"seed", BELAY_FIELD(config.seed), "seed of the weights and the data", kShowDefault},
    {"optimizer", BELAY_FIELD(config.optimizer), "adamw | sgd", kShowDefault},
    {"lr", BELAY_FIELD(config.lr), "peak learning rate", kShowDefault},
    {"weight-decay", BELAY_FIELD(config.weight_decay), "decoupled (AdamW) or coupled (SGD) decay", kShowDefault},
    {"momentum", BELAY_FIELD(config.momentum), "SGD momentum", kShowDefault},
    {"schedule", BELAY_FIELD(config.schedule), "constant | cosine (linear warmup, then cosine to 0)", kShowDefault},
    {"warmup", BELAY_FIELD(config.warmup), "warmup steps of the cosine schedule", kShowDefault},
    // Precision, the belts' faults, data parallelism, the log.
    {"dtype", BELAY_FIELD(dtype), "fp32 | fp16 | bf16 (compute dtype; masters stay fp32)", kShowDefault},
    {"device", BELAY_FIELD(config.device), "cpu | cuda[:N]", kShowDefault},
    {"grad-dtype", BELAY_FIELD(grad_dtype), "weight gradient buffers: fp32 | compute", kShowDefault},
    {"clip", BELAY_FIELD(config.max_norm), "clip the global gradient L2 norm to this (default: measure only)"},
    {"clip-mode", BELAY_FIELD(clip_mode),
     "norm: scale the gradient to --clip global L2 norm (direction kept); value: clamp each element to [-clip, clip] "
     "(direction changes)",
     kShowDefault},
    {"unfused", BELAY_FIELD(unfused), "PyTorch's order in separate passes (unscale_, clip_grad_norm_, step)"},
    {"inject-inf", BELAY_FIELD(inject), "plant an inf in a gradient at STEP (repeatable)"},
    {"inject-rank", BELAY_FIELD(config.inject_rank),
     "with --dist: plant --inject-inf on this rank only (default: every rank)", kCliOnly},
    {"dist", BELAY_FIELD(dist), "local | mpi (CPU) | nccl (GPU): one process per rank, started by mpirun -np N",
     kShowDefault | kCliOnly},
    {"dist-progress-thread", BELAY_FIELD(progress_thread),
     "with --dist mpi: a thread moves the gradient buckets while backward computes (MPI moves them only when called)",
     kCliOnly},
    {"shard-optimizer", BELAY_FIELD(config.shard_optimizer),
     "with --dist mpi and adamw: each rank keeps the FP32 masters and moments of its share of the parameters (ZeRO "
     "stage 1): gradients summed on their owner, updated parameters sent to every rank; the same bits as without",
     kCliOnly},
    {"bucket-mb", BELAY_FIELD(bucket_mb),
     "with --dist: gradients travel in buckets of about this many MB (FP32), each started while backward still runs; "
     "0: one bucket",
     kShowDefault | kCliOnly},
    {"dist-timeout", BELAY_FIELD(dist_timeout),
     "with --dist: seconds a rank waits for its peers in a collective before it stops every rank with an error (a "
     "rank died or hangs)",
     kShowDefault | kCliOnly},
    {"spike", BELAY_FIELD(spikes), "STEP:FACTOR multiplies that batch's targets, e.g. 12:1e8 (repeatable)"},
    {"csv", BELAY_FIELD(config.csv),
     "per-step log: step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale"},
    {"census", BELAY_FIELD(config.census),
     "the numerics census: per gradient per step, non-finite count, amax, underflow to zero, subnormals, zeros and "
     "headroom in bits in the compute dtype (fp16 unless bf16), as CSV; the step log names the tensors that overflowed"},
    {"census-every", BELAY_FIELD(config.census_every),
     "with --census: record every N-th step (every skipped step is recorded)", kShowDefault},
    {"census-casts", BELAY_FIELD(config.census_casts),
     "with --census: also count what the forward's casts to fp16/bf16 lost (activations per op, weights' working "
     "copies), as rows cast:SITE of the census file"},
    {"tensorboard", BELAY_FIELD(config.tensorboard),
     "write the step log (and the census, per tensor) as TensorBoard scalars into an event file in DIR"},
    // Loss scaling, the skip-rate watch, rollback.
    {"scaler", BELAY_FIELD(scaler_on), "dynamic loss scaling on (default: on for fp16 only)", 0, nullptr, "no-scaler"},
    {"no-scaler", BELAY_FIELD(no_scaler), "dynamic loss scaling off", 0, nullptr, "scaler"},
    {"init-scale", BELAY_FIELD(config.scaler.init_scale), "initial loss scale", kShowDefault},
    {"growth-factor", BELAY_FIELD(config.scaler.growth_factor), "scale growth factor", kShowDefault},
    {"backoff-factor", BELAY_FIELD(config.scaler.backoff_factor), "scale backoff factor", kShowDefault},
    {"growth-interval", BELAY_FIELD(config.scaler.growth_interval), "clean steps before growth", kShowDefault},
    {"hysteresis", BELAY_FIELD(config.scaler.hysteresis), "overflows tolerated before backing off", kShowDefault},
    {"min-scale", BELAY_FIELD(config.scaler.min_scale), "lowest loss scale", kShowDefault},
    {"max-scale", BELAY_FIELD(config.scaler.max_scale), "highest loss scale", kShowDefault},
    {"skip-window", BELAY_FIELD(config.skip.window), "steps the rolling skip rate is taken over", kShowDefault},
    {"skip-alert", BELAY_FIELD(config.skip.alert_rate), "print an alert when the skip rate passes this", kShowDefault},
    {"max-skip-rate", BELAY_FIELD(config.skip.max_rate), "stop (exit 1) when the skip rate stays above this ..."},
    {"skip-patience", BELAY_FIELD(config.skip.patience), "... for this many consecutive steps", kShowDefault},
    {"rollback-on", BELAY_FIELD(rollback_on),
     "keep the last good state and return to it when skip-rate, nonfinite-loss or divergence fires (comma-separated "
     "or repeated)",
     kCommaList},
    {"rollback-policy", BELAY_FIELD(rollback_policy),
     "after a rollback: stop (default, exit 1), fp32 (go on with autocast off) or lower-lr F (go on with the LR "
     "times F)",
     kOneOrTwo},
    {"rollback-every", BELAY_FIELD(config.rollback.every), "take a new good state at most every N steps", kShowDefault},
    {"rollback-skip-window", BELAY_FIELD(config.rollback.skip_window), "skip-rate: the steps counted", kShowDefault},
    {"rollback-skip-rate", BELAY_FIELD(config.rollback.max_skip_rate),
     "skip-rate: fires when more than this fraction of the window is skipped", kShowDefault},
    {"divergence-factor", BELAY_FIELD(config.rollback.divergence_factor),
     "divergence: fires when the smoothed loss (EMA 0.1) exceeds this times its best", kShowDefault},
    {"divergence-warmup", BELAY_FIELD(config.rollback.divergence_warmup),
     "divergence: applied steps before the best smoothed loss counts", kShowDefault},
    {"max-rollbacks", BELAY_FIELD(config.rollback.max_rollbacks), "with fp32/lower-lr: stop after this many",
     kShowDefault},
    {"rollback-report", BELAY_FIELD(config.rollback.report),
     "the case file (JSON; default: the CSV's name with .rollback.json, or rollback.json)"},
    // Files and display.
    {"data", BELAY_FIELD(config.data), "safetensors file with x [N, in] and y [N, out] (or I64 labels [N])"},
    {"init", BELAY_FIELD(config.init), "safetensors file with initial weights (state-dict names)"},
    {"checkpoint", BELAY_FIELD(config.checkpoint),
     "checkpoint file, written atomically at the end and on SIGINT/SIGTERM"},
    {"checkpoint-every", BELAY_FIELD(config.checkpoint_every), "also write it every N steps"},
    {"resume", BELAY_FIELD(config.resume), "continue from this checkpoint, up to --steps in all"},
    {"stop-at", BELAY_FIELD(config.stop_at), "stop after this many steps of the run (checkpointing), to resume later"},
    {"show-steps", BELAY_FIELD(config.show_steps), "print every step: STEP or SKIP, reason, norms, scale"},
    {"sync-each-step", BELAY_FIELD(config.sync_each_step),
     "wait for each step's log row before the next step (default: read one step late)"},
    {"quiet", BELAY_FIELD(config.quiet), "print nothing but errors"},
    {"scenario", BELAY_FIELD(scenario), "broken-batch: how one bad batch freezes unclipped Adam", kCliOnly},
    {"detect-anomaly", BELAY_FIELD(config.detect_anomaly),
     "stop at the first non-finite value (input, an op's output, the loss, a gradient, the optimizer's result) with "
     "a report; reads every tensor on the host (slow)"},
    {"fp32-ops", BELAY_FIELD(fp32_ops), "op classes autocast leaves in FP32, e.g. linear,gelu"},
    {"new-experiment", BELAY_FIELD(config.new_experiment),
     "allow --resume under another precision policy (--dtype, --grad-dtype, loss scaling, --fp32-ops): a new "
     "experiment from the checkpoint, recorded in it"},
    {"print-config", BELAY_FIELD(print_config),
     "print every option as the run would take it (the model's defaults filled in) and exit", kCliOnly},
  };
}

#undef BELAY_FIELD

std::pair<int64_t, float> parse_spike(const std::string& s) {
  const auto colon = s.find(':');
  if (colon == std::string::npos) throw UsageError("--spike expects STEP:FACTOR, got '" + s + "'");
  try {
    const std::optional<int64_t> step = parse_count(s.substr(0, colon));
    if (!step) throw std::invalid_argument("step");
    size_t used = 0;
    const std::string f = s.substr(colon + 1);
    const float factor = std::stof(f, &used);
    if (used != f.size()) throw std::invalid_argument("factor");
    return {*step, factor};
  } catch (const std::logic_error&) {
    throw UsageError("--spike expects STEP:FACTOR (e.g. 12:1e8), got '" + s + "'");
  }
}

// --rollback-on and --rollback-policy, from their words.
void read_rollback(const TrainOptions& o, RollbackOptions& rb) {
  parse_rollback_on(o.rollback_on, rb);
  if (o.rollback_policy.empty()) return;
  rb.policy = o.rollback_policy[0];
  if (rb.policy == "lower-lr") {
    if (o.rollback_policy.size() != 2) throw UsageError("--rollback-policy lower-lr needs a factor F, e.g. lower-lr 0.1");
    char* end = nullptr;
    rb.lr_factor = std::strtof(o.rollback_policy[1].c_str(), &end);
    if (*end != '\0' || o.rollback_policy[1].empty())
      throw UsageError("--rollback-policy lower-lr F: '" + o.rollback_policy[1] + "' is not a number");
  } else if (o.rollback_policy.size() != 1) {
    throw UsageError("--rollback-policy " + rb.policy + " takes no value");
  }
}

// The dtype, the gradients' dtype and the scaler switches into the config.
void read_precision(const TrainOptions& o, TrainConfig& c) {
  if (o.no_scaler && o.scaler_on) throw UsageError("--scaler and --no-scaler contradict each other");
  c.dtype = parse_dtype(o.dtype);
  c.low_precision_grads = parse_grad_dtype(o.grad_dtype);
  c.scaler_explicit = o.no_scaler || o.scaler_on;
  c.scaler.enabled = o.scaler_on || (!o.no_scaler && c.dtype == DType::F16);
  c.fused = !o.unfused;
}

}  // namespace

const std::vector<TrainOption>& train_options() {
  static const std::vector<TrainOption> options = make_train_options();
  return options;
}

namespace {
std::string underscored(std::string name) {
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}
}  // namespace

std::string keyword_of(const TrainOption& option) { return option.keyword ? option.keyword : underscored(option.name); }

const TrainOption* option_of_keyword(const std::string& keyword) {
  for (const TrainOption& o : train_options())
    if (!(o.traits & kCliOnly) && (keyword == keyword_of(o) || keyword == underscored(o.name))) return &o;
  return nullptr;
}

const TrainOption* option_named(const std::string& name) {
  for (const TrainOption& o : train_options())
    if (name == o.name) return &o;
  return nullptr;
}

bool is_flag(const TrainOption& option) { return std::holds_alternative<bool& (*)(TrainOptions&)>(option.field); }

TrainConfig finish_train_options(TrainOptions& o) {
  TrainConfig& c = o.config;
  c.given = o.given;
  apply_init_settings(c, o.given);
  if (find_model_kind(c.model)) apply_kind_defaults(c, o.given);  // an unknown kind is refused by validate
  read_precision(o, c);
  read_rollback(o, c.rollback);
  c.clip_mode = parse_clip_mode(o.clip_mode);
  c.fp32_ops = parse_fp32_ops(o.fp32_ops);
  c.inject_inf.insert(o.inject.begin(), o.inject.end());
  for (const std::string& s : o.spikes) c.spikes.insert(parse_spike(s));
  return c;
}

std::string train_config_text(TrainOptions& o) {
  std::ostringstream text;
  text.precision(9);
  auto item = [&](const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) text << v;
    else text << +v;
  };
  for (const TrainOption& row : train_options()) {
    if (row.traits & kCliOnly) continue;
    text << row.name << "=";
    std::visit(
        [&](auto field) {
          const auto& value = field(o);
          if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::vector<std::string>> ||
                        std::is_same_v<std::decay_t<decltype(value)>, std::vector<int64_t>>) {
            for (size_t i = 0; i < value.size(); ++i) {
              if (i) text << ",";
              item(value[i]);
            }
          } else {
            item(value);
          }
        },
        row.field);
    text << "\n";
  }
  const TrainConfig& c = o.config;  // what the words became
  text << "(read) dtype=" << dtype_name(c.dtype) << " scaler=" << c.scaler.enabled << " grads=" << c.low_precision_grads
       << " clip_mode=" << (c.clip_mode == ClipMode::Value ? "value" : "norm") << " fp32_ops=" << c.fp32_ops
       << " rollback=" << c.rollback.on_skip_rate << c.rollback.on_nonfinite_loss << c.rollback.on_divergence << ":"
       << c.rollback.policy << ":" << c.rollback.lr_factor << " inject=" << c.inject_inf.size()
       << " spikes=" << c.spikes.size() << "\n";
  return text.str();
}

}  // namespace belay
