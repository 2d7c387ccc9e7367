// `belay sweep --ranks N`: the CLI starts itself again under mpirun, N processes, with
// `--dist mpi` in place of `--ranks N`, and waits for it. The sweep then runs as every
// distributed run does (one replica per process, rank 0 reports), so a point measured on N
// ranks is exactly what `mpirun -np N belay train --dist mpi` would do.
#pragma once
#include <string>
#include <vector>

namespace belay {

// Whether this belay was built with MPI (CMake found OpenMPI).
bool mpi_built_in();

// The launcher's command line, split on whitespace ("mpirun --allow-run-as-root"), its
// first word found on PATH (or given as a path). Throws UsageError when MPI is not built in,
// when the launcher is not found, or when this process already runs under mpirun.
std::vector<std::string> find_mpirun(const std::string& launcher, const std::string& what);

// Runs `launcher -np ranks <this executable> args...` and returns its exit status (128 +
// the signal when it was killed). The child shares stdout and stderr.
int run_under_mpirun(const std::vector<std::string>& launcher, int ranks, const std::vector<std::string>& args);

}  // namespace belay
