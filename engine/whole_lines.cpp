#include "engine/whole_lines.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

namespace belay {

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

LineBuffer::int_type LineBuffer::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
  pending_.push_back(traits_type::to_char_type(ch));
  if (pending_.back() == '\n') write_whole_lines();
  return ch;
}

std::streamsize LineBuffer::xsputn(const char* s, std::streamsize n) {
  pending_.append(s, static_cast<size_t>(n));
  if (std::string_view(s, static_cast<size_t>(n)).find('\n') != std::string_view::npos) write_whole_lines();
  return n;
}

int LineBuffer::sync() {
  write_all(fd_, pending_);
  pending_.clear();
  return 0;
}

void LineBuffer::write_whole_lines() {
  const size_t end = pending_.rfind('\n');
  if (end == std::string::npos) return;
  write_all(fd_, std::string_view(pending_).substr(0, end + 1));
  pending_.erase(0, end + 1);
}

void print_whole_lines() {
  // Never destroyed: std::cout is flushed at exit, after static objects could be gone.
  static LineBuffer* const out = new LineBuffer(STDOUT_FILENO);
  static LineBuffer* const err = new LineBuffer(STDERR_FILENO);
  if (std::cout.rdbuf() == out) return;
  std::cout.flush();
  std::fflush(nullptr);  // what C stdio holds goes before anything written from now on
  std::cout.rdbuf(out);
  std::cerr.rdbuf(err);
  // std::cerr flushes after every insertion (unitbuf): that would write each piece of a
  // line as it comes, which is what the buffer is here to stop. It still writes each line
  // as soon as the line ends.
  std::cerr.unsetf(std::ios_base::unitbuf);
}

void print_line(std::ostream& out, std::string_view line) {
  std::string whole;
  whole.reserve(line.size() + 1);
  whole.append(line);
  whole.push_back('\n');
  out.write(whole.data(), static_cast<std::streamsize>(whole.size()));
  out.flush();
}

}  // namespace belay
