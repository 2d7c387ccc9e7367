// GPT-2's byte-to-unicode alphabet: each of the 256 bytes stands for one printable Unicode
// character, so that a token's bytes can be written as text in vocab.json and merges.txt (a
// space is "Ġ", a newline "Ċ"). The printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the other 68, in byte order, for U+0100, U+0101, ...
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace belay {

// The alphabet's character for `byte`, as UTF-8.
const std::string& byte_char(uint8_t byte);
// Each byte of `bytes` as its character: the form vocab.json and merges.txt use.
std::string bytes_to_alphabet(std::string_view bytes);
// A token's bytes from its vocab.json form, as Hugging Face's ByteLevel decoder reads it:
// each character back to its byte; a token with any character outside the alphabet (an added
// token such as "<pad>" is inside it; one with other text is not) gives its UTF-8 bytes as they are.
std::string alphabet_to_bytes(std::string_view token);

}  // namespace belay
