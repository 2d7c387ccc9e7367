// Files written whole or not at all: the bytes go to a temporary file beside the target,
// which is synced and renamed over it only once complete, so a reader (or a crash) never
// sees half a checkpoint, log or picture, and a failed write leaves the old file as it was.
// Every error names the path the user gave, never the temporary.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace belay {

class AtomicFile {
 public:
  // Creates a fresh temporary beside `path` (first removing what a killed writer left there).
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // not committed: the temporary is removed, the target untouched

  // The temporary's path, for a program that writes it by name (rsvg-convert).
  const std::string& temp_path() const { return temp_; }
  // `what` says which part failed ("writing the header").
  void write(const void* data, size_t size, const char* what);
  void write(std::string_view text) { write(text.data(), text.size(), "writing"); }
  // Syncs the temporary, renames it over the target and syncs the folder.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& step);
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomically(const std::string& path, std::string_view text);

// Throws a usage error, naming `path`, when a file cannot be created beside it (checked
// before a long run whose result would otherwise be lost at the end).
void check_writable(const std::string& path);

// Removes the temporaries that a writer killed mid-write left beside `path`
// ("<path>.tmp.<pid>.<n>" whose pid no longer runs); AtomicFile calls it first. Returns how
// many. Files of a live process (this one included) are kept.
int remove_stale_temporaries(const std::string& path);

}  // namespace belay
