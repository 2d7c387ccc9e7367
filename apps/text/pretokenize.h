// GPT-2's pre-tokenization: text cut into the pieces that byte-level BPE merges within, by
// the pattern of Hugging Face's ByteLevel pre-tokenizer (add_prefix_space=False, use_regex=True)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// run with PCRE2 (UTF + UCP, JIT where the library has it). \s is Unicode's White_Space, as
// Oniguruma (what `tokenizers` runs) reads it, spelt out: PCRE2's own \s adds U+180E.
//
// Input is any bytes. A byte that does not start a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequence) is a piece by
// itself; the valid text between such bytes is cut by the pattern, each run on its own (a
// run's end is the end of the text for the pattern's look-ahead). On valid UTF-8 the pieces are
// exactly Hugging Face's; on any bytes they cover the input, in order, with nothing left out.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace belay {

// Calls `piece` with each piece of `text`, in order (views into `text`).
void pretokenize(std::string_view text, const std::function<void(std::string_view)>& piece);
std::vector<std::string_view> pretokenize(std::string_view text);

// The length of the well-formed UTF-8 sequence that starts `bytes` (1..4), or 0 when none does.
size_t utf8_sequence_length(std::string_view bytes);

}  // namespace belay
