// apps/run/utf8_chunks.h: streamed bytes go out in whole UTF-8 characters; anything that is not
// UTF-8 goes out unchanged; nothing is lost or reordered.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "apps/run/utf8_chunks.h"

using namespace belay;

namespace {

// The chunks of `text` pushed a byte at a time, then finish().
std::vector<std::string> byte_by_byte(const std::string& text) {
  Utf8Chunks c;
  std::vector<std::string> out;
  for (char b : text) out.push_back(c.push(std::string(1, b)));
  out.push_back(c.finish());
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

}  // namespace

TEST_CASE("utf8 chunks: ASCII goes out at once, a character when its last byte comes", "[apps][sample]") {
  CHECK(byte_by_byte("ab") == std::vector<std::string>{"a", "b", ""});
  // e-acute (2 bytes), the euro sign (3), an emoji (4): held until complete.
  CHECK(byte_by_byte("x\xc3\xa9") == std::vector<std::string>{"x", "", "\xc3\xa9", ""});
  CHECK(byte_by_byte("\xe2\x82\xac!") == std::vector<std::string>{"", "", "\xe2\x82\xac", "!", ""});
  CHECK(byte_by_byte("\xf0\x9f\x98\x80") == std::vector<std::string>{"", "", "", "\xf0\x9f\x98\x80", ""});
  Utf8Chunks c;
  CHECK(c.push("d\xc3\xa9" "f\xe2\x82") == "d\xc3\xa9" "f");  // many bytes at once: up to the unfinished one
  CHECK(c.push("\xac") == "\xe2\x82\xac");
}

TEST_CASE("utf8 chunks: bytes that are not UTF-8 pass unchanged, none lost", "[apps][sample]") {
  // A lone continuation byte, a lead byte cut short by ASCII, bytes that lead nothing, a
  // character cut short at the end of the text (finish gives it back).
  CHECK(byte_by_byte("\x80" "a") == std::vector<std::string>{"\x80", "a", ""});
  CHECK(byte_by_byte("\xc3" "a") == std::vector<std::string>{"", "\xc3" "a", ""});
  CHECK(byte_by_byte("\xff\xfe") == std::vector<std::string>{"\xff", "\xfe", ""});
  CHECK(byte_by_byte("a\xe2\x82") == std::vector<std::string>{"a", "", "", "\xe2\x82"});
  CHECK(byte_by_byte("\x80\x80\x80\x80\x80") == std::vector<std::string>{"\x80", "\x80", "\x80", "\x80", "\x80", ""});
  // Every byte value after every byte value: the output is the input.
  std::string all;
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; b += 5) all += std::string{static_cast<char>(a), static_cast<char>(b)};
  CHECK(joined(byte_by_byte(all)) == all);
}
