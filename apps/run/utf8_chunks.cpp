#include "apps/run/utf8_chunks.h"

namespace belay {

namespace {

bool continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// The length a lead byte announces (2, 3 or 4), or 1 for ASCII and bytes that lead nothing.
size_t announced(unsigned char b) {
  if (b >= 0xC0 && b < 0xE0) return 2;
  if (b >= 0xE0 && b < 0xF0) return 3;
  if (b >= 0xF0 && b < 0xF5) return 4;
  return 1;
}

// Where the unfinished character at the end of s starts, or s.size() when there is none: the
// last lead byte among the final three, if only continuation bytes follow it and they are
// fewer than it announces.
size_t unfinished_start(const std::string& s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const unsigned char b = static_cast<unsigned char>(s[s.size() - back]);
    if (continuation(b)) continue;
    return announced(b) > back ? s.size() - back : s.size();
  }
  return s.size();  // four continuation bytes in a row, or fewer and nothing before: not held
}

}  // namespace

std::string Utf8Chunks::push(const std::string& bytes) {
  held_ += bytes;
  const size_t cut = unfinished_start(held_);
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

std::string Utf8Chunks::finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace belay
