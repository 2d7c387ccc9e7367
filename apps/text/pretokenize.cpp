// GPT-2's pre-tokenization with PCRE2 (apps/text/pretokenize.h says what it matches).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "apps/text/pretokenize.h"

#include <pcre2.h>

#include <memory>

#include "engine/error.h"

namespace belay {
namespace {

// Unicode's White_Space property, which Oniguruma's \s is (and \S its complement).
#define BELAY_WS "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" BELAY_WS "\\p{L}\\p{N}]+|[" BELAY_WS "]+(?![^" BELAY_WS
    "])|[" BELAY_WS "]+";
#undef BELAY_WS

// A match can need more backtracking stack than JIT's default 32 KiB (a long run of spaces
// before a letter backs off one space at a time): each match gets up to this much.
constexpr size_t kJitStackBytes = 8 << 20;

struct Pattern {
  pcre2_code* code = nullptr;
  bool jit = false;
  Pattern() {
    int err = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                         &at, nullptr);
    if (!code) throw Error("pretokenize: PCRE2 refused GPT-2's pattern (error " + std::to_string(err) + ")");
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pattern() { pcre2_code_free(code); }
};

const Pattern& gpt2_pattern() {
  static const Pattern p;  // compiled once; pcre2_code is shared read-only between threads
  return p;
}

// What one call of pretokenize() matches with: its own match data and JIT stack.
class Matcher {
 public:
  explicit Matcher(const Pattern& p) : p_(p), data_(pcre2_match_data_create_from_pattern(p.code, nullptr)) {
    if (p.jit) {
      stack_ = pcre2_jit_stack_create(32 << 10, kJitStackBytes, nullptr);
      context_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context_, nullptr, stack_);
    }
  }
  ~Matcher() {
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(stack_);
    pcre2_match_data_free(data_);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // Cuts valid UTF-8 `run` by the pattern. Every character matches one of the alternatives, so
  // the pieces are the matches; a gap (none is expected) would be a piece too.
  void cut(std::string_view run, const std::function<void(std::string_view)>& piece) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(run.data());
    size_t at = 0;
    while (at < run.size()) {
      const int rc = pcre2_match(p_.code, subject, run.size(), at, PCRE2_NO_UTF_CHECK, data_, context_);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw Error("pretokenize: PCRE2 failed on a piece of text (error " + std::to_string(rc) + ")");
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(data_);
      if (span[0] > at) piece(run.substr(at, span[0] - at));
      if (span[1] <= span[0]) throw Error("pretokenize: GPT-2's pattern matched an empty piece");
      piece(run.substr(span[0], span[1] - span[0]));
      at = span[1];
    }
    if (at < run.size()) piece(run.substr(at));
  }

 private:
  const Pattern& p_;
  pcre2_match_data* data_;
  pcre2_jit_stack* stack_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

size_t utf8_sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629's table)
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c == 0xED) len = 3, hi = 0x9F;  // no surrogates
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c == 0xF4) len = 4, hi = 0x8F;  // nothing above U+10FFFF
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else return 0;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
  if (s.size() < len || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < len; ++i)
    if (!continuation(b(i))) return 0;
  return len;
}

void pretokenize(std::string_view text, const std::function<void(std::string_view)>& piece) {
  Matcher matcher(gpt2_pattern());
  size_t run_start = 0, at = 0;
  while (at < text.size()) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {  // the common case, in a tight loop
      ++at;
      continue;
    }
    const size_t len = utf8_sequence_length(text.substr(at));
    if (len > 0) {
      at += len;
      continue;
    }
    if (at > run_start) matcher.cut(text.substr(run_start, at - run_start), piece);
    piece(text.substr(at, 1));  // an invalid byte: a piece by itself
    run_start = ++at;
  }
  if (at > run_start) matcher.cut(text.substr(run_start, at - run_start), piece);
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

}  // namespace belay
