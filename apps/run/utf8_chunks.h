// Text streamed a token at a time, released in whole UTF-8 characters: a byte-level model
// makes a multi-byte character over several tokens, and a terminal (or a decoder reading the
// pipe) that got half of one between two flushes could show a replacement mark for it. Bytes
// that are not UTF-8 are passed on as they are, never checked, replaced or dropped.
#pragma once
#include <string>

namespace belay {

class Utf8Chunks {
 public:
  // `bytes` appended; returns what can go out now: everything but a trailing sequence that
  // is the start of a character still missing bytes.
  std::string push(const std::string& bytes);
  // What is held back (an unfinished character at the end of the text): all of it.
  std::string finish();

 private:
  std::string held_;
};

}  // namespace belay
