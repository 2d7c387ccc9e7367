#include "engine/text_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "engine/error.h"

namespace belay {

std::ifstream open_text_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError("cannot read " + what + " '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw UsageError(what + " '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read " + what + " '" + path + "': " + std::strerror(errno));
  return in;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in = open_text_file(path, what);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw UsageError("reading " + what + " '" + path + "' failed");
  return text.str();
}

bool read_text_line(std::istream& in, std::string& line) {
  if (!std::getline(in, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace belay
