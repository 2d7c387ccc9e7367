#include "apps/cli/mpi_launch.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include "engine/error.h"

namespace belay {

bool mpi_built_in() {
#ifdef BELAY_HAVE_MPI
  return true;
#else
  return false;
#endif
}

namespace {

bool executable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// `name` as execvp would find it, or "".
std::string on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
  }
  return "";
}

}  // namespace

std::vector<std::string> find_mpirun(const std::string& launcher, const std::string& what) {
  if (!mpi_built_in())
    throw UsageError(what + ": this belay was built without MPI; install openmpi-bin and libopenmpi-dev "
                            "(third_party/install_deps.sh) and rebuild");
  // Started by mpirun already: each rank would start N more.
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && *n)
    throw UsageError(what + " starts mpirun itself; under mpirun give --dist mpi instead");
  std::vector<std::string> words;
  std::stringstream ss(launcher);
  for (std::string w; ss >> w;) words.push_back(w);
  if (words.empty()) throw UsageError(what + ": --mpirun is empty");
  const std::string found = on_path(words[0]);
  if (found.empty())
    throw UsageError(what + ": '" + words[0] + "' not found" + (words[0].find('/') == std::string::npos ? " on PATH" : "") +
                     " (install openmpi-bin, or name the launcher with --mpirun)");
  words[0] = found;
  return words;
}

int run_under_mpirun(const std::vector<std::string>& launcher, int ranks, const std::vector<std::string>& args) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw Error(std::string("cannot find this executable (/proc/self/exe): ") + std::strerror(errno));
  self[n] = '\0';
  std::vector<std::string> words = launcher;
  words.insert(words.end(), {"-np", std::to_string(ranks), self});
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::cout.flush();  // what this process printed comes before the ranks' output
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cannot start mpirun: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    // Only async-signal-safe calls between fork and _exit.
    const char msg[] = "belay: error: cannot execute the MPI launcher\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(std::string("waiting for mpirun: ") + std::strerror(errno));
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace belay
