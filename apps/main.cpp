// The belay CLI: parsing and wiring only. Every error is one line, "belay: error: ...",
// with exit status 2 for bad usage or input and 1 for a failure at run time.
#include <CLI/CLI.hpp>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "amp/communicator.h"
#include "apps/accum_check.h"
#include "apps/finfo_cmd.h"
#include "apps/mpi_launch.h"
#include "apps/plot.h"
#include "apps/train.h"
#include "apps/validate.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/whole_lines.h"

namespace {

std::string version_string() {
  std::string v = std::string("belay ") + BELAY_VERSION + " (cpu";
  if (BELAY_CUDA_EMULATION)
    v += ", cuda emulated on the CPU (SIMT emulator): " + std::to_string(belay::cuda_device_count()) + " device(s)";
  else if (belay::cuda_compiled())
    v += ", cuda built: " + std::to_string(belay::cuda_device_count()) + " device(s) visible";
  else v += ", built without cuda";
  return v + "; " + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
}

std::pair<int64_t, float> parse_spike(const std::string& s) {
  const auto colon = s.find(':');
  if (colon == std::string::npos) throw belay::UsageError("--spike expects STEP:FACTOR, got '" + s + "'");
  try {
    size_t used = 0;
    const long long step = std::stoll(s.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("step");
    const std::string f = s.substr(colon + 1);
    const float factor = std::stof(f, &used);
    if (used != f.size()) throw std::invalid_argument("factor");
    return {step, factor};
  } catch (const std::logic_error&) {
    throw belay::UsageError("--spike expects STEP:FACTOR (e.g. 12:1e8), got '" + s + "'");
  }
}

// The rank of this process under mpirun (0 when not started by mpirun). Before the
// communicator exists (it may be what failed), the launcher's environment says it.
int launcher_rank(const belay::Communicator* comm) {
  if (comm) return comm->rank();
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return rank ? std::atoi(rank) : 0;
}

// A usage error is the same on every rank (all read the same options and files), so under
// mpirun rank 0 alone says it and exits 2. The other ranks must not end first: mpirun stops
// the job at the first rank that exits with an error, and under load it killed rank 0
// before its line was out (the line lost, or cut by mpirun's banner). So they wait to be
// ended by mpirun once rank 0 has failed (no rank calls MPI_Finalize, which would wait for
// them all), and mpirun reports one failure, rank 0's exit 2.
// An error that only this rank met is said, naming the rank, after the wait.
constexpr int kSilentRankWaitSeconds = 10;
int usage_error_exit(const std::string& message, const belay::Communicator* comm) {
  const int rank = launcher_rank(comm);
  if (rank == 0) {
    std::cerr << "belay: error: " << message << "\n";
    return 2;
  }
  std::signal(SIGTERM, SIG_DFL);  // mpirun's SIGTERM ends this process at once
  std::signal(SIGINT, SIG_DFL);
  std::this_thread::sleep_for(std::chrono::seconds(kSilentRankWaitSeconds));
  std::cerr << "belay: error: rank " << rank << ": " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  belay::print_whole_lines();
  CLI::App app{"belay: mixed-precision training with its safety belts (FP32 masters, FP16/BF16 compute)"};
  app.set_version_flag("--version", version_string());
  app.require_subcommand(1);
  // A global option, accepted after the subcommand too (fallthrough is inherited by the
  // subcommands added below).
  std::string cpu_isa;
  app.add_option("--cpu-isa", cpu_isa,
                 "vector ISA of the CPU kernels: baseline | avx2 | avx512 | avx512bf16 | amx (default: the widest "
                 "this CPU has, amx only when asked for, or BELAY_CPU_ISA); one the CPU lacks is an error");
  app.fallthrough();

  belay::TrainConfig tc;
  std::string dtype = "fp32", scenario, grad_dtype = "fp32", clip_mode = "norm";
  std::vector<int64_t> inject;
  std::vector<std::string> spikes;
  bool no_scaler = false, scaler_on = false, unfused = false;
  std::string dist = "local";
  CLI::App* train = app.add_subcommand("train", "train a Linear model (or an MLP) on seeded synthetic data");
  train->add_option("--model", tc.model, "linear | mlp")->capture_default_str();
  train->add_option("--in", tc.in_features, "input features")->capture_default_str();
  train->add_option("--out", tc.out_features, "output features")->capture_default_str();
  train->add_option("--hidden", tc.hidden, "MLP hidden width")->capture_default_str();
  train->add_option("--layers", tc.layers, "MLP linear layers")->capture_default_str();
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
  train->add_option("--dtype", dtype, "fp32 | fp16 | bf16 (compute dtype; masters stay fp32)")->capture_default_str();
  train->add_option("--device", tc.device, "cpu | cuda[:N]")->capture_default_str();
  train->add_option("--grad-dtype", grad_dtype, "weight gradient buffers: fp32 | compute")->capture_default_str();
  train->add_option("--clip", tc.max_norm, "clip the global gradient L2 norm to this (default: measure only)");
  train->add_option("--clip-mode", clip_mode,
                    "norm: scale the gradient to --clip global L2 norm (direction kept); value: clamp each element "
                    "to [-clip, clip] (direction changes)")->capture_default_str();
  train->add_flag("--unfused", unfused, "PyTorch's order in separate passes (unscale_, clip_grad_norm_, step)");
  train->add_option("--inject-inf", inject, "plant an inf in a gradient at STEP (repeatable)");
  train->add_option("--inject-rank", tc.inject_rank, "with --dist: plant --inject-inf on this rank only (default: every rank)");
  train->add_option("--dist", dist,
                    "local | mpi (CPU) | nccl (GPU): one process per rank, started by mpirun -np N")->capture_default_str();
  double bucket_mb = 25.0, dist_timeout = 300.0;
  bool progress_thread = false;
  train->add_flag("--dist-progress-thread", progress_thread,
                  "with --dist mpi: a thread moves the gradient buckets while backward computes (MPI moves them "
                  "only when called)");
  train->add_option("--bucket-mb", bucket_mb,
                    "with --dist: gradients travel in buckets of about this many MB (FP32), each started while "
                    "backward still runs; 0: one bucket")->capture_default_str();
  train->add_option("--dist-timeout", dist_timeout,
                    "with --dist: seconds a rank waits for its peers in a collective before it stops every rank "
                    "with an error (a rank died or hangs)")->capture_default_str();
  train->add_option("--spike", spikes, "STEP:FACTOR multiplies that batch's targets, e.g. 12:1e8 (repeatable)");
  train->add_option("--csv", tc.csv, "per-step log: step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,scaler_scale");
  train->add_flag("--scaler", scaler_on, "dynamic loss scaling on (default: on for fp16 only)");
  train->add_flag("--no-scaler", no_scaler, "dynamic loss scaling off");
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
  std::vector<std::string> rollback_on, rollback_policy;
  train->add_option("--rollback-on", rollback_on,
                    "keep the last good state and return to it when skip-rate, nonfinite-loss or divergence fires "
                    "(comma-separated or repeated)")->delimiter(',');
  train->add_option("--rollback-policy", rollback_policy,
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
  train->add_option("--scenario", scenario, "broken-batch: how one bad batch freezes unclipped Adam");
  std::string fp32_ops;
  train->add_flag("--detect-anomaly", tc.detect_anomaly,
                  "stop at the first non-finite value (input, an op's output, the loss, a gradient, the optimizer's "
                  "result) with a report; reads every tensor on the host (slow)");
  train->add_option("--fp32-ops", fp32_ops, "op classes autocast leaves in FP32, e.g. linear,gelu");
  train->add_flag("--new-experiment", tc.new_experiment,
                  "allow --resume under another precision policy (--dtype, --grad-dtype, loss scaling, --fp32-ops): "
                  "a new experiment from the checkpoint, recorded in it");

  belay::ValidateConfig vc;
  std::string validate_dtype = "fp16", validate_fp32_ops;
  CLI::App* validate = app.add_subcommand("validate", "check fp16/bf16 autocast against the FP32 reference on a fixed set");
  validate->add_option("--dtype", validate_dtype, "fp16 | bf16")->capture_default_str();
  validate->add_option("--model", vc.model, "linear | mlp (ignored with --checkpoint)")->capture_default_str();
  validate->add_option("--in", vc.in_features, "input features")->capture_default_str();
  validate->add_option("--out", vc.out_features, "outputs (classes of the generated set)")->capture_default_str();
  validate->add_option("--hidden", vc.hidden, "MLP hidden width")->capture_default_str();
  validate->add_option("--layers", vc.layers, "MLP linear layers")->capture_default_str();
  validate->add_option("--seed", vc.seed, "seed of the model and the generated set")->capture_default_str();
  validate->add_option("--init", vc.init, "the model's weights (safetensors, state-dict names)");
  validate->add_option("--checkpoint", vc.checkpoint, "the model from a belay checkpoint (its shape too)");
  validate->add_option("--data", vc.data, "the set: x [N, in], y (I64 labels [N] or targets [N, out]), optional I64 kind [N]");
  validate->add_option("--rows", vc.rows, "ordinary rows of the generated set (and rows/4 of each other kind)")->capture_default_str();
  validate->add_option("--save-set", vc.save_set, "write the generated set here");
  // Unset unless given: the defaults are the dtype's, and no typed value stands for them.
  validate->add_option_function<double>("--rtol", [&vc](const double& v) { vc.rtol = v; },
                                        "score tolerance relative to the row's max |ref| (default 16 u of the dtype)");
  validate->add_option_function<double>("--atol", [&vc](const double& v) { vc.atol = v; },
                                        "absolute score tolerance (default u of the dtype)");
  validate->add_option("--max-flips", vc.max_flips, "changed decisions allowed")->capture_default_str();
  validate->add_option("--min-quality", vc.min_quality, "minimum accuracy (labels) or R^2 (targets), for both runs");
  validate->add_option_function<double>("--tie-margin", [&vc](const double& v) { vc.tie_margin = v; },
                                        "reference top-2 margin under which a row is a near-tie (default 64 u)");
  validate->add_option("--fp32-ops", validate_fp32_ops, "op classes autocast leaves in FP32, e.g. linear,gelu");
  validate->add_option("--json", vc.json, "also write the report here (atomically)");
  validate->add_option("--train", vc.train_steps, "first train N steps in fp32 and under AMP from the same init and data");
  validate->add_option("--lr", vc.lr, "AdamW learning rate of --train")->capture_default_str();
  validate->add_option("--batch", vc.batch, "batch of --train")->capture_default_str();

  std::vector<std::string> finfo_values;
  CLI::App* finfo = app.add_subcommand("finfo", "the fp32/fp16/bf16 table; with values, how each rounds");
  finfo->add_option("values", finfo_values, "numbers to round through each dtype");

  app.add_subcommand("info", "what this build and machine provide");

  belay::AccumCheckConfig ac;
  CLI::App* accum = app.add_subcommand("accum-check", "prove gradient accumulation equals one full-batch step (fp32)");
  accum->add_option("--model", ac.model, "linear | mlp")->capture_default_str();
  accum->add_option("--batch", ac.batch, "the full batch (split 1x, 2x and 4x)")->capture_default_str();
  accum->add_option("--seed", ac.seed, "seed")->capture_default_str();

  belay::SweepConfig sc;
  std::string sweep_dtype = "fp32";
  CLI::App* sweep = app.add_subcommand("sweep", "throughput against the number of accumulated micro-batches");
  sweep->add_option("--micro-batch", sc.micro_batch, "samples per micro-batch")->capture_default_str();
  sweep->add_option("--accum", sc.accum, "accumulation steps to measure")->delimiter(',')->capture_default_str();
  sweep->add_option("--steps", sc.base.steps, "steps per point")->capture_default_str();
  sweep->add_option("--model", sc.base.model, "linear | mlp")->capture_default_str();
  sweep->add_option("--in", sc.base.in_features, "input features")->capture_default_str();
  sweep->add_option("--out", sc.base.out_features, "output features")->capture_default_str();
  sweep->add_option("--dtype", sweep_dtype, "fp32 | fp16 | bf16")->capture_default_str();
  sweep->add_option("--device", sc.base.device, "cpu | cuda[:N]")->capture_default_str();
  sweep->add_option("--json", sc.json, "write the points here (atomically)");
  int sweep_ranks = 1;
  std::string sweep_dist = "local", mpirun = "mpirun";
  sweep->add_option("--ranks", sweep_ranks,
                    "run every point on N processes: starts mpirun -np N with --dist mpi (batch = micro-batch x "
                    "accum x N)")->capture_default_str();
  sweep->add_option("--mpirun", mpirun, "the launcher --ranks runs, e.g. 'mpirun --allow-run-as-root --oversubscribe'")
      ->capture_default_str();
  sweep->add_option("--dist", sweep_dist, "local | mpi (what --ranks gives each rank; under mpirun by hand)")
      ->capture_default_str();

  std::vector<std::string> plot_csvs;
  std::string plot_out;
  CLI::App* plot = app.add_subcommand("plot", "draw step logs (loss, norms, scale, LR, skips) as SVG or PNG");
  plot->add_option("csv", plot_csvs, "one step log, or up to 4 to overlay (e.g. fp32.csv amp.csv)")->required();
  plot->add_option("-o,--out", plot_out, "FILE.svg or FILE.png (PNG through rsvg-convert); default: the first CSV as .svg");

  std::string export_checkpoint, export_out;
  CLI::App* exporter = app.add_subcommand("export", "write a checkpoint's weights alone, as safetensors");
  exporter->add_option("--checkpoint", export_checkpoint, "a belay checkpoint")->required();
  exporter->add_option("--out", export_out, "the weights file to write")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error_exit(std::string(e.what()) + " (see belay --help)", nullptr);
  }

  // Outlives the handlers below: an error on one rank of a distributed run must end them all.
  std::unique_ptr<belay::Communicator> comm;
  try {
    // Decided here, before any work: an unknown or unavailable path (option or
    // BELAY_CPU_ISA) is a usage error whatever the command.
    if (!cpu_isa.empty()) belay::select_cpu_isa(cpu_isa);
    const std::string isa_line = belay::cpu_isa_line();
    if (*finfo) return belay::run_finfo(finfo_values, std::cout);
    if (app.got_subcommand("info")) {
      std::cout << version_string() << "\n";
      std::cout << "cpu isa: " << isa_line << "\n";
      return 0;
    }
    if (*accum) return belay::run_accum_check(ac, std::cout);
    if (*validate) {
      vc.dtype = belay::parse_dtype(validate_dtype);
      vc.fp32_ops = belay::parse_fp32_ops(validate_fp32_ops);
      return belay::run_validate(vc, std::cout).exit_code;
    }
    if (*sweep) {
      sc.base.dtype = belay::parse_dtype(sweep_dtype);
      if (sweep_ranks < 1) throw belay::UsageError("sweep: --ranks must be at least 1, got " + std::to_string(sweep_ranks));
      if (sweep_ranks > 1) {
        if (sweep_dist != "local") throw belay::UsageError("sweep: --ranks starts the ranks itself; drop --dist");
        const std::vector<std::string> launcher = belay::find_mpirun(mpirun, "sweep --ranks " + std::to_string(sweep_ranks));
        // This command line again, with --dist mpi in place of --ranks N (and without --mpirun).
        std::vector<std::string> args;
        for (int i = 1; i < argc; ++i) {
          const std::string a = argv[i];
          if (a == "--ranks" || a == "--mpirun") ++i;
          else if (a.rfind("--ranks=", 0) != 0 && a.rfind("--mpirun=", 0) != 0) args.push_back(a);
        }
        args.insert(args.end(), {"--dist", "mpi"});
        return belay::run_under_mpirun(launcher, sweep_ranks, args);
      }
      if (sweep_dist != "local") {
        comm = belay::make_communicator(sweep_dist);
        sc.base.comm = comm.get();
      } else if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoi(n) > 1) {
        throw belay::UsageError(std::string("sweep started by mpirun with ") + n +
                                " processes but without --dist mpi: use belay sweep --ranks N (it starts mpirun)");
      }
      return belay::run_sweep(sc, std::cout);
    }
    if (*plot) return belay::run_plot(plot_csvs, plot_out, std::cout);
    if (*exporter) {
      belay::export_weights(export_checkpoint, export_out);
      std::cout << "wrote " << export_out << "\n";
      return 0;
    }
    if (!scenario.empty()) {
      if (scenario != "broken-batch") throw belay::UsageError("unknown scenario '" + scenario + "': use broken-batch");
      return belay::run_broken_batch(std::cout);
    }
    if (no_scaler && scaler_on) throw belay::UsageError("--scaler and --no-scaler contradict each other");
    tc.dtype = belay::parse_dtype(dtype);
    if (grad_dtype == "compute") tc.low_precision_grads = true;
    else if (grad_dtype != "fp32") throw belay::UsageError("unknown --grad-dtype '" + grad_dtype + "': use fp32 or compute");
    tc.scaler_explicit = no_scaler || scaler_on;
    tc.scaler.enabled = scaler_on || (!no_scaler && tc.dtype == belay::DType::F16);
    tc.fused = !unfused;
    for (const std::string& r : rollback_on) {
      if (r == "skip-rate") tc.rollback.on_skip_rate = true;
      else if (r == "nonfinite-loss") tc.rollback.on_nonfinite_loss = true;
      else if (r == "divergence") tc.rollback.on_divergence = true;
      else throw belay::UsageError("unknown --rollback-on '" + r + "': use skip-rate, nonfinite-loss or divergence");
    }
    if (!rollback_policy.empty()) {
      tc.rollback.policy = rollback_policy[0];
      if (tc.rollback.policy == "lower-lr") {
        if (rollback_policy.size() != 2) throw belay::UsageError("--rollback-policy lower-lr needs a factor F, e.g. lower-lr 0.1");
        char* end = nullptr;
        tc.rollback.lr_factor = std::strtof(rollback_policy[1].c_str(), &end);
        if (*end != '\0' || rollback_policy[1].empty())
          throw belay::UsageError("--rollback-policy lower-lr F: '" + rollback_policy[1] + "' is not a number");
      } else if (rollback_policy.size() != 1) {
        throw belay::UsageError("--rollback-policy " + tc.rollback.policy + " takes no value");
      }
    }
    if (clip_mode == "value") tc.clip_mode = belay::ClipMode::Value;
    else if (clip_mode != "norm") throw belay::UsageError("unknown --clip-mode '" + clip_mode + "': use norm or value");
    tc.fp32_ops = belay::parse_fp32_ops(fp32_ops);
    tc.inject_inf.insert(inject.begin(), inject.end());
    for (const std::string& s : spikes) tc.spikes.insert(parse_spike(s));
    tc.handle_signals = true;
    if (dist != "local") {
      comm = belay::make_communicator(dist);
      tc.comm = comm.get();
      if (!(bucket_mb >= 0.0 && bucket_mb <= 1.0e6))
        throw belay::UsageError("--bucket-mb must be between 0 (one bucket) and 1e6, got " + CLI::detail::to_string(bucket_mb));
      if (!(dist_timeout > 0.0 && dist_timeout <= 1.0e7))
        throw belay::UsageError("--dist-timeout must be a positive number of seconds, got " + CLI::detail::to_string(dist_timeout));
      comm->set_bucket_bytes(static_cast<size_t>(bucket_mb * 1048576.0));
      comm->set_timeout_seconds(dist_timeout);
      comm->set_progress_thread(progress_thread);
    } else if (progress_thread) {
      throw belay::UsageError("--dist-progress-thread needs --dist mpi");
    } else if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoi(n) > 1) {
      // Each process would train alone and all would write the same CSV and checkpoint.
      throw belay::UsageError(std::string("started by mpirun with ") + n +
                              " processes but without --dist mpi: add it (or run one process)");
    }
    return belay::run_training(tc, std::cout).exit_code;
  } catch (const belay::UsageError& e) {
    std::cout.flush();
    const int code = usage_error_exit(e.what(), comm.get());
    // With peers, no MPI_Finalize: it waits for every rank, and this exit is what tells
    // mpirun to end the ranks that wait (see usage_error_exit). The process ends here anyway.
    if (comm && comm->world_size() > 1) (void)comm.release();
    return code;
  } catch (const std::bad_alloc&) {
    // What a part of belay that names its allocations did not catch.
    std::cout.flush();
    std::cerr << "belay: error: out of memory (a host allocation failed)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    if (comm && comm->world_size() > 1) {
      std::cerr << "belay: error: rank " << comm->rank() << ": " << e.what() << "\n";
      comm->abort(1);  // its peers may be waiting in a collective: end them all
    }
    std::cerr << "belay: error: " << e.what() << "\n";
    return 1;
  }
}
