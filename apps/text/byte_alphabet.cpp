// GPT-2's byte-to-unicode alphabet (apps/text/byte_alphabet.h).
#include "apps/text/byte_alphabet.h"

#include <array>

namespace belay {
namespace {

bool stands_for_itself(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

std::string utf8(uint32_t cp) {  // code points below U+0800 only: the alphabet's largest is U+0143
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

struct Alphabet {
  std::array<std::string, 256> chars;
  std::array<int, 0x144> byte_of;  // code point -> byte, -1 where no byte stands there
  Alphabet() {
    byte_of.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = stands_for_itself(b) ? static_cast<uint32_t>(b) : next++;
      chars[b] = utf8(cp);
      byte_of[cp] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::string& byte_char(uint8_t byte) { return alphabet().chars[byte]; }

std::string bytes_to_alphabet(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_char(static_cast<uint8_t>(c));
  return out;
}

std::string alphabet_to_bytes(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<uint8_t>(token[i]);
    uint32_t cp = 0;
    size_t len = 0;
    if (c0 < 0x80) {
      cp = c0, len = 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size() && (static_cast<uint8_t>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu), len = 2;
    }
    if (len == 0 || cp >= a.byte_of.size() || a.byte_of[cp] < 0) return std::string(token);  // not the alphabet's
    out += static_cast<char>(a.byte_of[cp]);
    i += len;
  }
  return out;
}

}  // namespace belay
