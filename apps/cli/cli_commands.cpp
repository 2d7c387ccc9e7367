// The CLI's other subcommands: validate, sample, accum-check, sweep, finfo, info, plot, export,
// import.
// Each: its option table, and the parsed options handed to the library.
#include <omp.h>

#include <cstdlib>
#include <iostream>

#include "amp/autocast.h"
#include "amp/checkpoint.h"
#include "apps/cli/cli.h"
#include "apps/cli/mpi_launch.h"
#include "apps/run/hf_gpt2.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

std::string version_string() {
  std::string v = std::string("belay ") + BELAY_VERSION + " (cpu";
  if (BELAY_CUDA_EMULATION)
    v += ", cuda emulated on the CPU (SIMT emulator): " + std::to_string(cuda_device_count()) + " device(s)";
  else if (cuda_compiled())
    v += ", cuda built: " + std::to_string(cuda_device_count()) + " device(s) visible";
  else v += ", built without cuda";
  return v + "; " + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
}

void add_validate_command(CLI::App& app, ValidateCommand& v) {
  ValidateConfig& vc = v.config;
  CLI::App* validate = v.app =
      app.add_subcommand("validate", "check fp16/bf16 autocast against the FP32 reference on a fixed set");
  validate->add_option("--dtype", v.dtype, "fp16 | bf16")->capture_default_str();
  validate->add_option("--model", vc.model, "linear | mlp | gpt (ignored with --checkpoint; a GPT needs --checkpoint and --data)")->capture_default_str();
  validate->add_option("--in", vc.in_features, "input features")->capture_default_str();
  validate->add_option("--out", vc.out_features, "outputs (classes of the generated set)")->capture_default_str();
  validate->add_option("--hidden", vc.hidden, "MLP hidden width")->capture_default_str();
  validate->add_option("--layers", vc.layers, "MLP linear layers")->capture_default_str();
  validate->add_option("--seed", vc.seed, "seed of the model and the generated set")->capture_default_str();
  validate->add_option("--init", vc.init, "the model's weights (safetensors, state-dict names)");
  validate->add_option("--checkpoint", vc.checkpoint, "the model from a belay checkpoint or model file (its shape too)");
  validate->add_option("--data", vc.data, "the set: x [N, in], y (I64 labels [N] or targets [N, out]), optional I64 kind [N]; for a GPT checkpoint, the tokens file (its held-out split)");
  validate->add_option("--rows", vc.rows, "ordinary rows of the generated set (and rows/4 of each other kind)")->capture_default_str();
  validate->add_option("--save-set", vc.save_set, "write the generated set here");
  // Unset unless given: the defaults are the dtype's, and no typed value stands for them.
  validate->add_option_function<double>("--rtol", [&vc](const double& x) { vc.rtol = x; },
                                        "score tolerance relative to the row's max |ref| (default 16 u of the dtype)");
  validate->add_option_function<double>("--atol", [&vc](const double& x) { vc.atol = x; },
                                        "absolute score tolerance (default u of the dtype)");
  validate->add_option("--max-flips", vc.max_flips, "changed decisions allowed")->capture_default_str();
  validate->add_option("--min-quality", vc.min_quality, "minimum accuracy (labels) or R^2 (targets), for both runs");
  validate->add_option_function<double>("--tie-margin", [&vc](const double& x) { vc.tie_margin = x; },
                                        "reference top-2 margin under which a row is a near-tie (default 64 u)");
  validate->add_option("--fp32-ops", v.fp32_ops, "op classes autocast leaves in FP32, e.g. linear,gelu");
  validate->add_option("--json", vc.json, "also write the report here (atomically)");
  validate->add_option("--train", vc.train_steps, "first train N steps in fp32 and under AMP from the same init and data");
  validate->add_option("--lr", vc.lr, "AdamW learning rate of --train")->capture_default_str();
  validate->add_option("--batch", vc.batch, "batch of --train")->capture_default_str();
  validate->add_option("--windows", vc.windows,
                       "GPT checkpoint: held-out windows of the --data tokens file to run (each a context of "
                       "next-token decisions)")->capture_default_str();
}

int run_validate_command(ValidateCommand& v) {
  v.config.dtype = parse_dtype(v.dtype);
  v.config.fp32_ops = parse_fp32_ops(v.fp32_ops);
  return run_validate(v.config, std::cout).exit_code;
}

void add_sample_command(CLI::App& app, SampleCommand& s) {
  SampleConfig& sc = s.config;
  CLI::App* sample = s.app = app.add_subcommand("sample", "generate text from a GPT checkpoint (belay train --model gpt)");
  sample->add_option("--checkpoint", sc.checkpoint, "a checkpoint of a --model gpt run")->required();
  sample->add_option("--prompt", sc.prompt, "the text to continue (its bytes are the first tokens)")->required();
  sample->add_option("--tokens", sc.tokens, "tokens to generate")->capture_default_str();
  sample->add_option("--temperature", sc.temperature, "softmax(logits / T); 0: always the most likely token")
      ->capture_default_str();
  sample->add_option("--seed", sc.seed, "seed of the draws (the same seed gives the same text)")->capture_default_str();
  sample->add_option("--top-k", sc.top_k, "draw among the K most likely tokens only; 0: all")->capture_default_str();
  sample->add_flag_function(
      "--no-kv-cache", [&sc](int64_t) { sc.kv_cache = false; },
      "rerun the whole window for every token (the reference the KV cache matches bit for bit)");
}

// The text goes out as it is made: each chunk flushed, so a pipe or a terminal sees every
// token when it is picked rather than all of them at the end.
int run_sample_command(const SampleCommand& s) {
  sample_stream(s.config, [](const std::string& bytes) {
    std::cout << bytes << std::flush;
    if (!std::cout) throw Error("sample: could not write the text to stdout (was the pipe closed?)");
  });
  std::cout << "\n" << std::flush;
  return 0;
}

void add_finfo_info_commands(CLI::App& app, SmallCommands& s) {
  s.finfo = app.add_subcommand("finfo", "the fp32/fp16/bf16 table; with values, how each rounds");
  s.finfo->add_option("values", s.finfo_values, "numbers to round through each dtype");
  s.info = app.add_subcommand("info", "what this build and machine provide");
}

int run_info_command(const std::string& isa_line) {
  std::cout << version_string() << "\n";
  std::cout << "cpu isa: " << isa_line << "\n";
  std::cout << "cpu gemm: " << cpu_gemm_line() << "\n";
  return 0;
}

void add_accum_check_command(CLI::App& app, AccumCheckCommand& a) {
  AccumCheckConfig& ac = a.config;
  CLI::App* accum = a.app =
      app.add_subcommand("accum-check", "prove gradient accumulation equals one full-batch step (fp32)");
  accum->add_option("--model", ac.model, "linear | mlp")->capture_default_str();
  accum->add_option("--batch", ac.batch, "the full batch (split 1x, 2x and 4x)")->capture_default_str();
  accum->add_option("--seed", ac.seed, "seed")->capture_default_str();
}

void add_sweep_command(CLI::App& app, SweepCommand& s) {
  SweepConfig& sc = s.config;
  CLI::App* sweep = s.app = app.add_subcommand("sweep", "throughput against the number of accumulated micro-batches");
  sweep->add_option("--micro-batch", sc.micro_batch, "samples per micro-batch")->capture_default_str();
  sweep->add_option("--accum", sc.accum, "accumulation steps to measure")->delimiter(',')->capture_default_str();
  sweep->add_option("--steps", sc.base.steps, "steps per point")->capture_default_str();
  sweep->add_option("--model", sc.base.model, "linear | mlp")->capture_default_str();
  sweep->add_option("--in", sc.base.in_features, "input features")->capture_default_str();
  sweep->add_option("--out", sc.base.out_features, "output features")->capture_default_str();
  sweep->add_option("--dtype", s.dtype, "fp32 | fp16 | bf16")->capture_default_str();
  sweep->add_option("--device", sc.base.device, "cpu | cuda[:N]")->capture_default_str();
  sweep->add_option("--json", sc.json, "write the points here (atomically)");
  sweep->add_option("--ranks", s.ranks,
                    "run every point on N processes: starts mpirun -np N with --dist mpi (batch = micro-batch x "
                    "accum x N)")->capture_default_str();
  sweep->add_option("--mpirun", s.mpirun, "the launcher --ranks runs, e.g. 'mpirun --allow-run-as-root --oversubscribe'")
      ->capture_default_str();
  sweep->add_option("--dist", s.dist, "local | mpi (what --ranks gives each rank; under mpirun by hand)")
      ->capture_default_str();
}

namespace {

// `sweep --ranks N`: this command line again under mpirun, with --dist mpi in place of
// --ranks N (and without --mpirun).
int sweep_under_mpirun(const SweepCommand& s, int argc, char** argv) {
  if (s.dist != "local") throw UsageError("sweep: --ranks starts the ranks itself; drop --dist");
  const std::vector<std::string> launcher = find_mpirun(s.mpirun, "sweep --ranks " + std::to_string(s.ranks));
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" || a == "--mpirun") ++i;
    else if (a.rfind("--ranks=", 0) != 0 && a.rfind("--mpirun=", 0) != 0) args.push_back(a);
  }
  args.insert(args.end(), {"--dist", "mpi"});
  return run_under_mpirun(launcher, s.ranks, args);
}

}  // namespace

int run_sweep_command(SweepCommand& s, int argc, char** argv, std::unique_ptr<Communicator>& comm) {
  s.config.base.dtype = parse_dtype(s.dtype);
  if (s.ranks < 1) throw UsageError("sweep: --ranks must be at least 1, got " + std::to_string(s.ranks));
  if (s.ranks > 1) return sweep_under_mpirun(s, argc, argv);
  if (s.dist != "local") {
    comm = make_communicator(s.dist);
    s.config.base.comm = comm.get();
    comm->connect();
  } else if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoi(n) > 1) {
    throw UsageError(std::string("sweep started by mpirun with ") + n +
                     " processes but without --dist mpi: use belay sweep --ranks N (it starts mpirun)");
  }
  return run_sweep(s.config, std::cout);
}

void add_plot_export_commands(CLI::App& app, SmallCommands& s) {
  s.plot = app.add_subcommand("plot", "draw step logs (loss, norms, scale, LR, skips) as SVG or PNG");
  s.plot->add_option("csv", s.plot_csvs, "one step log, or up to 4 to overlay (e.g. fp32.csv amp.csv)");
  s.plot->add_option("--census", s.plot_census,
                     "a census file (belay train --census): heat maps of headroom and underflow, tensors x steps (.svg)");
  s.plot->add_option("-o,--out", s.plot_out, "FILE.svg or FILE.png (PNG through rsvg-convert); default: the first CSV as .svg");
  s.exporter = app.add_subcommand("export", "write a checkpoint's weights alone: a belay model file, or GPT-2 for Hugging Face");
  s.exporter->add_option("checkpoint,--checkpoint", s.export_checkpoint,
                         "a belay checkpoint (--format hf: or a model file of belay import)")->required();
  s.exporter->add_option("-o,--out", s.export_out,
                         "the file to write (--format hf: a new directory for config.json and model.safetensors)")
      ->required();
  s.exporter->add_option("--format", s.export_format,
                         "belay (the weights and the model's settings, safetensors) or hf (what "
                         "GPT2LMHeadModel.from_pretrained loads; a GPT only)")
      ->check(CLI::IsMember({"belay", "hf"}))
      ->capture_default_str();
  s.importer = app.add_subcommand("import", "read a Hugging Face GPT-2 (config.json + model.safetensors) as a belay model file");
  s.importer->add_option("dir,--dir", s.import_dir, "the directory save_pretrained wrote")->required();
  s.importer->add_option("-o,--out", s.import_out,
                         "the model file to write (for belay train --init, belay sample, belay export)")
      ->required();
}

int run_export_command(const SmallCommands& s) {
  if (s.export_format == "hf") {
    for (const std::string& file : export_hf_gpt2(s.export_checkpoint, s.export_out)) std::cout << "wrote " << file << "\n";
    return 0;
  }
  export_weights(s.export_checkpoint, s.export_out);
  std::cout << "wrote " << s.export_out << "\n";
  return 0;
}

int run_import_command(const SmallCommands& s) {
  const HfGpt2 model = read_hf_gpt2(s.import_dir);
  for (const std::string& note : model.notes) std::cout << "note: " << note << "\n";
  write_model_file(s.import_out, model, {{"imported_from", s.import_dir}});
  const auto& m = model.settings;
  std::cout << "wrote " << s.import_out << ": gpt, " << m.at("layers") << " layers, width " << m.at("width") << ", "
            << m.at("heads") << " heads, context " << m.at("context") << ", vocabulary " << m.at("out") << ", gelu "
            << m.at("gelu")
            << (model.tokenizer ? ", and its tokenizer (" + std::to_string(model.tokenizer->merges()) + " merges)" : "")
            << "\n";
  return 0;
}

}  // namespace belay
