// The one error type of belay. Anything a user can cause (bad shapes, bad files, bad
// arguments) is reported by throwing belay::Error with a message that says what was
// wrong and what to do; the CLI turns it into one line and a non-zero exit.
#pragma once
#include <stdexcept>
#include <string>

namespace belay {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Usage errors (bad arguments, bad input files) exit 2 in the CLI; the rest exit 1.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

}  // namespace belay
