// The belay CLI's subcommands: for each, what its options fill (a struct the CLI11 option
// table binds to), the table itself, and how the parsed options become a run of the
// training library. Parsing and wiring only; apps/cli/cli_main.cpp dispatches and reports errors.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "amp/dist/communicator.h"
#include "apps/run/accum_check.h"
#include "apps/run/sample.h"
#include "apps/run/train.h"
#include "apps/run/train_options.h"
#include "apps/run/validate.h"

namespace belay {

// "belay 0.1.0 (cpu, ...; N OpenMP threads)": --version and `belay info`.
std::string version_string();

// `belay train`
struct TrainCommand {
  CLI::App* app = nullptr;
  TrainOptions options;  // the option table's fields (apps/run/train_options.h)
};
void add_train_command(CLI::App& app, TrainCommand& t);
// Once parsed: the options given recorded and the words read (finish_train_options).
TrainConfig finish_train_command(TrainCommand& t);
// Runs it; a communicator it makes (--dist) is left in `comm`, for main's error handling.
int run_train_command(TrainCommand& t, std::unique_ptr<Communicator>& comm);

// `belay validate`
struct ValidateCommand {
  CLI::App* app = nullptr;
  ValidateConfig config;
  std::string dtype = "fp16", fp32_ops;
};
void add_validate_command(CLI::App& app, ValidateCommand& v);
int run_validate_command(ValidateCommand& v);

// `belay sample`: text from a GPT checkpoint (apps/run/sample.h).
struct SampleCommand {
  CLI::App* app = nullptr;
  SampleConfig config;
};
void add_sample_command(CLI::App& app, SampleCommand& s);
int run_sample_command(const SampleCommand& s);

// `belay sweep`
struct SweepCommand {
  CLI::App* app = nullptr;
  SweepConfig config;
  std::string dtype = "fp32";
  int ranks = 1;
  std::string dist = "local", mpirun = "mpirun";
};
void add_sweep_command(CLI::App& app, SweepCommand& s);
// argv: the command line, given again to mpirun by --ranks N.
int run_sweep_command(SweepCommand& s, int argc, char** argv, std::unique_ptr<Communicator>& comm);

// `belay accum-check`
struct AccumCheckCommand {
  CLI::App* app = nullptr;
  AccumCheckConfig config;
};
void add_accum_check_command(CLI::App& app, AccumCheckCommand& a);

// `belay finfo` and `belay info`; `belay plot`, `belay export` and `belay import`: a few options
// each (two groups, in the order --help lists the subcommands).
struct SmallCommands {
  CLI::App *finfo = nullptr, *info = nullptr, *plot = nullptr, *exporter = nullptr, *importer = nullptr;
  std::vector<std::string> finfo_values;
  std::vector<std::string> plot_csvs;
  std::string plot_out;
  std::string plot_census;
  std::string export_checkpoint, export_out, export_format = "belay";
  std::string import_dir, import_out;
};
void add_finfo_info_commands(CLI::App& app, SmallCommands& s);
void add_plot_export_commands(CLI::App& app, SmallCommands& s);
int run_info_command(const std::string& isa_line);  // isa_line: cpu_isa_line(), taken before any command
int run_export_command(const SmallCommands& s);
int run_import_command(const SmallCommands& s);

}  // namespace belay
