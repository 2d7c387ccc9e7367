// Every line belay prints reaches its file descriptor in one write(): another writer on the
// same pipe or terminal (mpirun's banners, another rank, a test harness) can then come
// before or after a line, never inside it. A chain of `<<` into an unbuffered std::cerr
// is one write() per piece; LineBuffer gathers the pieces and writes whole lines.
#pragma once
#include <streambuf>
#include <string>
#include <string_view>

namespace belay {

// Writes all of `bytes` to `fd` in as few write() calls as the kernel allows (one, for a
// pipe and anything up to PIPE_BUF bytes), retrying after EINTR. Errors are dropped: there
// is nowhere left to report them.
void write_all(int fd, std::string_view bytes);

// A streambuf that keeps what it is given until a line ends, then writes every whole line
// it holds in one write(). An explicit flush (std::flush, a live progress line ending in
// '\r') writes what it holds, whole or not.
class LineBuffer : public std::streambuf {
 public:
  explicit LineBuffer(int fd) : fd_(fd) {}
  ~LineBuffer() override { sync(); }

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  void write_whole_lines();
  int fd_;
  std::string pending_;
};

// Makes std::cout and std::cerr write through LineBuffers on descriptors 1 and 2 (once;
// later calls do nothing). Programs call it first thing in main.
void print_whole_lines();

// `line` and a newline as one insertion, then a flush: one write() of the whole line on a
// stream that goes through a LineBuffer, and on an unbuffered C stderr too (library code
// that prints, such as a checkpoint's warning, may run under Python without the CLI's
// buffers).
void print_line(std::ostream& out, std::string_view line);

}  // namespace belay
