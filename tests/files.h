// Files for the tests: a path under /tmp private to this test process, and a whole file read
// or written in one call (the checkpoint, rollback and plot tests cut, flip and rewrite files).
#pragma once
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace belay::test {

// "/tmp/belay_<prefix>_<pid>_<name>": two test processes never share a file.
inline std::string temp_path(const std::string& prefix, const std::string& name) {
  return "/tmp/belay_" + prefix + "_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace belay::test
