// `belay train`: CLI11 options made from the option table (apps/run/train_options.h), and the
// parsed options turned into a TrainConfig (each bad value one UsageError) and a run of the
// training library.
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <type_traits>
#include <variant>

#include "apps/cli/cli.h"
#include "apps/run/model_kinds.h"
#include "apps/run/train_options.h"
#include "apps/run/trainer.h"
#include "engine/error.h"

namespace belay {
namespace {

// One row of the option table as a CLI11 option bound to its field: a flag for a switch,
// an option taking a value (or repeated, for a list) otherwise.
void add_table_option(CLI::App* train, const TrainOption& row, TrainOptions& o) {
  const std::string flag = std::string("--") + row.name;
  CLI::Option* option = std::visit(
      [&](auto field) -> CLI::Option* {
        auto& value = field(o);
        if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>)
          return train->add_flag(flag, value, row.help);
        else
          return train->add_option(flag, value, row.help);
      },
      row.field);
  if (row.traits & kShowDefault) option->capture_default_str();
  if (row.traits & kCommaList) option->delimiter(',');
  if (row.traits & kOneOrTwo) option->expected(1, 2);
}

// --dist: the communicator and its settings; without it, a run under mpirun is refused.
void set_dist(const TrainOptions& t, TrainConfig& tc, std::unique_ptr<Communicator>& comm) {
  if (t.dist != "local") {
    validate_dist_device(t.dist, tc.device);  // before MPI's (and NCCL's) init
    comm = make_communicator(t.dist);
    tc.comm = comm.get();
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
  t.app = app.add_subcommand("train", "train a model: a Linear layer or an MLP on seeded synthetic rows (or --data), "
                                      "a GPT on a tokens file");
  for (const TrainOption& row : train_options()) add_table_option(t.app, row, t.options);
}

TrainConfig finish_train_command(TrainCommand& t) {
  for (const CLI::Option* o : t.app->get_options())
    if (o->count() > 0) t.options.given.insert(o->get_lnames().begin(), o->get_lnames().end());  // "lr", "weight-decay"
  return finish_train_options(t.options);
}

int run_train_command(TrainCommand& t, std::unique_ptr<Communicator>& comm) {
  if (!t.options.scenario.empty()) {
    if (t.options.scenario != "broken-batch")
      throw UsageError("unknown scenario '" + t.options.scenario + "': use broken-batch");
    return run_broken_batch(std::cout);
  }
  TrainConfig tc = finish_train_command(t);
  if (t.options.print_config) {
    std::cout << train_config_text(t.options) << std::flush;
    return 0;
  }
  if (const ModelKind* kind = find_model_kind(tc.model); kind && kind->token_data && tc.data.empty())
    tc.data = default_tokens_path();
  tc.handle_signals = true;
  set_dist(t.options, tc, comm);
  return Trainer(tc, std::cout).run().exit_code;
}

}  // namespace belay
