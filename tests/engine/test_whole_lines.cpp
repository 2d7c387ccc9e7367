// Every line in one write(): a SOCK_SEQPACKET socket keeps the boundaries of the writes made
// to it (each write() is one message), so the reader sees exactly how a line went out.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "engine/whole_lines.h"

namespace {

struct MessagePipe {
  int fds[2] = {-1, -1};
  MessagePipe() { REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds) == 0); }
  ~MessagePipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  int writer() const { return fds[0]; }
  void close_writer() { ::close(fds[0]); fds[0] = -1; }
  // Every message written so far, one string per write() (the writer must be closed first).
  std::vector<std::string> messages() {
    std::vector<std::string> got;
    char buf[8192];
    for (ssize_t n; (n = ::recv(fds[1], buf, sizeof buf, 0)) > 0;) got.emplace_back(buf, static_cast<size_t>(n));
    return got;
  }
};

}  // namespace

TEST_CASE("LineBuffer writes a line built by many insertions in one write()", "[engine][whole_lines]") {
  MessagePipe pipe;
  {
    belay::LineBuffer buf(pipe.writer());
    std::ostream out(&buf);
    out << "belay: error: " << "rank " << 1 << ": " << 2.5 << " went wrong" << '\n';
    out << "first\nsecond" << " half" << "\n";   // a line goes out as soon as it ends
    out << "no end yet";                          // held: not a line
    out << std::flush;                            // an explicit flush writes it
    out << "\r" << "step 3/10" << "\033[K" << std::flush;  // a live progress line
    belay::print_line(out, "a line of its own");
    out << "left at the end";                     // written when the buffer goes
  }
  pipe.close_writer();
  const std::vector<std::string> want{"belay: error: rank 1: 2.5 went wrong\n", "first\n", "second half\n", "no end yet",
                                      "\rstep 3/10\033[K", "a line of its own\n", "left at the end"};
  CHECK(pipe.messages() == want);
}

TEST_CASE("print_whole_lines makes std::cerr and std::cout write whole lines", "[engine][whole_lines]") {
  // In a child process: it replaces the process's std::cout and std::cerr buffers.
  MessagePipe err, out;
  std::cout.flush();
  std::fflush(nullptr);  // nothing of this process's own output may reach the child's sockets
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(err.writer(), STDERR_FILENO);
    ::dup2(out.writer(), STDOUT_FILENO);
    belay::print_whole_lines();
    belay::print_whole_lines();  // a second call changes nothing
    // std::cerr flushes after every insertion (unitbuf) and is tied to std::cout: neither
    // may cut a line.
    std::cerr << "belay: error: " << "sweep --ranks " << 2 << " starts mpirun itself" << "\n";
    std::cout << "step " << 5 << "/" << 10 << "\n";
    std::cerr << "belay: warning: " << "two" << "\n";
    std::cout << "the end" << std::endl;
    std::cout.flush();
    std::cerr.flush();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  err.close_writer();
  out.close_writer();
  CHECK(err.messages() == std::vector<std::string>{"belay: error: sweep --ranks 2 starts mpirun itself\n",
                                                   "belay: warning: two\n"});
  CHECK(out.messages() == std::vector<std::string>{"step 5/10\n", "the end\n"});
}
