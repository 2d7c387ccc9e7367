// Files for the tests: a path under /tmp private to this test process, removed when the process
// exits, and a whole file read or written in one call (the checkpoint, rollback and plot tests
// cut, flip and rewrite files).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace belay::test {

// Removes, at the process's exit, every /tmp entry whose name starts with a prefix handed out by
// temp_path: the file itself and what the code under test made beside it (a checkpoint's
// ".tmp" or rotated copies, a folder of tokenizer files). A test that fails keeps nothing either:
// the failure's message says what differed, and a rerun makes the files again.
class TempFiles {
 public:
  static TempFiles& instance() {
    static TempFiles files;
    return files;
  }
  void keep_track(const std::string& name_prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    prefixes_.insert(name_prefix);
  }
  ~TempFiles() {
    if (::getpid() != owner_) return;  // a forked child that exits normally leaves its parent's files
    std::error_code ec;
    std::vector<std::filesystem::path> doomed;  // listed first: no removal under the iterator
    for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
      const std::string name = entry.path().filename().string();
      for (const auto& prefix : prefixes_)
        if (name.compare(0, prefix.size(), prefix) == 0) doomed.push_back(entry.path());
    }
    for (const auto& path : doomed) std::filesystem::remove_all(path, ec);
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::set<std::string> prefixes_;
};

// "/tmp/belay_<prefix>_<pid>_<name>": two test processes never share a file.
inline std::string temp_path(const std::string& prefix, const std::string& name) {
  const std::string name_prefix = "belay_" + prefix + "_" + std::to_string(::getpid()) + "_";
  TempFiles::instance().keep_track(name_prefix);
  return "/tmp/" + name_prefix + name;
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
