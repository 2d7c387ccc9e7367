// The belay CLI's main (apps/cli/main.cpp calls it; here, in belay_cli, it is compiled in one
// unit with the other files that parse with CLI11): parsing and wiring only. Every error is one
// line, "belay: error: ...", with exit status 2 for bad usage or input and 1 for a failure at
// run time. Each subcommand's options and wiring: apps/cli/cli_train.cpp, apps/cli/cli_commands.cpp.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include "amp/dist/communicator.h"
#include "apps/cli/bpe_cmd.h"
#include "apps/cli/cli.h"
#include "apps/cli/cli_main.h"
#include "apps/cli/finfo_cmd.h"
#include "apps/plot/census_plot.h"
#include "apps/plot/plot.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/whole_lines.h"

namespace {

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

// Every subcommand's options, bound to the tables of one CLI::App.
struct Commands {
  belay::TrainCommand train;
  belay::ValidateCommand validate;
  belay::SampleCommand sample;
  belay::AccumCheckCommand accum;
  belay::SweepCommand sweep;
  belay::SmallCommands small;
  belay::BpeCommand bpe;
  std::string cpu_isa;  // the global --cpu-isa
};

void add_commands(CLI::App& app, Commands& c) {
  app.set_version_flag("--version", belay::version_string());
  app.require_subcommand(1);
  // A global option, accepted after the subcommand too (fallthrough is inherited by the
  // subcommands added below).
  app.add_option("--cpu-isa", c.cpu_isa,
                 "vector ISA of the CPU kernels: baseline | avx2 | avx512 | avx512bf16 | amx (default: the widest "
                 "this CPU has, or BELAY_CPU_ISA); one the CPU lacks is an error");
  app.fallthrough();
  belay::add_train_command(app, c.train);
  belay::add_validate_command(app, c.validate);
  belay::add_sample_command(app, c.sample);
  belay::add_finfo_info_commands(app, c.small);
  belay::add_accum_check_command(app, c.accum);
  belay::add_sweep_command(app, c.sweep);
  belay::add_plot_export_commands(app, c.small);
  belay::add_bpe_commands(app, c.bpe);
}

// The parsed command, run. `comm`: a communicator a command made (--dist), kept by cli_main.
int run_command(Commands& c, int argc, char** argv, std::unique_ptr<belay::Communicator>& comm) {
  // Decided here, before any work: an unknown or unavailable path (option or
  // BELAY_CPU_ISA) is a usage error whatever the command.
  if (!c.cpu_isa.empty()) belay::select_cpu_isa(c.cpu_isa);
  const std::string isa_line = belay::cpu_isa_line();
  if (*c.small.finfo) return belay::run_finfo(c.small.finfo_values, std::cout);
  if (*c.small.info) return belay::run_info_command(isa_line);
  if (*c.accum.app) return belay::run_accum_check(c.accum.config, std::cout);
  if (*c.validate.app) return belay::run_validate_command(c.validate);
  if (*c.sample.app) return belay::run_sample_command(c.sample);
  if (*c.sweep.app) return belay::run_sweep_command(c.sweep, argc, argv, comm);
  if (*c.small.plot && !c.small.plot_census.empty()) {
    if (!c.small.plot_csvs.empty()) throw belay::UsageError("belay plot: give step logs or --census, not both");
    return belay::run_census_plot(c.small.plot_census, c.small.plot_out, std::cout);
  }
  if (*c.small.plot && c.small.plot_csvs.empty())
    throw belay::UsageError("belay plot: give a step log (CSV) to draw, or --census FILE");
  if (*c.small.plot) return belay::run_plot(c.small.plot_csvs, c.small.plot_out, std::cout);
  if (*c.small.exporter) return belay::run_export_command(c.small);
  if (*c.small.importer) return belay::run_import_command(c.small);
  if (std::optional<int> status = belay::run_bpe_command(c.bpe, std::cout)) return *status;
  return belay::run_train_command(c.train, comm);
}

}  // namespace

int belay::cli_main(int argc, char** argv) {
  belay::print_whole_lines();
  CLI::App app{"belay: mixed-precision training with its safety belts (FP32 masters, FP16/BF16 compute)"};
  Commands commands;
  add_commands(app, commands);
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
    return run_command(commands, argc, argv, comm);
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
