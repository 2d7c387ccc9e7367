#include "engine/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>

#include "engine/error.h"

namespace belay {

namespace {

std::atomic<uint64_t> g_temp_counter{0};

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string folder_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

int remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(folder_of(path), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // PID.N and nothing else
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || !all_digits(rest.substr(0, dot)) || !all_digits(rest.substr(dot + 1))) continue;
    const long long pid = std::stoll(rest.substr(0, dot));
    if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) continue;
    // Only a process that is gone (ESRCH) leaves an orphan; a live one (EPERM: someone
    // else's) may be writing it right now.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw UsageError("cannot write a file with an empty name");
  remove_stale_temporaries(path_);
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_temp_counter++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) {
    const int err = errno;
    throw UsageError("cannot write '" + path_ + "': " + std::strerror(err) +
                     (err == ENOENT ? " (its folder '" + folder_of(path_) + "' does not exist)" : std::string()));
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& step) {
  const int err = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  committed_ = true;  // nothing left for the destructor
  throw Error("cannot write '" + path_ + "': " + step + ": " + std::strerror(err) +
              " (the previous file, if any, is unchanged)");
}

void AtomicFile::write(const void* data, size_t size, const char* what) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = EIO;
    if (w <= 0) fail(what);
    p += w;
    size -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("fsync");
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail("close");
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming the temporary file over it");
  committed_ = true;
  // The rename is durable only once the folder is on disk too.
  const std::string dir = folder_of(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int synced = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (synced != 0 && err != EINVAL && err != EROFS)
      throw Error("wrote '" + path_ + "' but could not fsync its folder '" + dir + "': " + std::strerror(err));
  }
}

void write_file_atomically(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

void check_writable(const std::string& path) { AtomicFile probe(path); }

}  // namespace belay
