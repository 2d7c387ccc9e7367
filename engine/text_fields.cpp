#include "engine/text_fields.h"

namespace belay {

std::vector<std::string> split_fields(std::string_view line) {
  std::vector<std::string> fields;
  for (size_t from = 0;;) {
    const size_t comma = line.find(',', from);
    fields.emplace_back(line.substr(from, comma == std::string_view::npos ? std::string_view::npos : comma - from));
    if (comma == std::string_view::npos) return fields;
    from = comma + 1;
  }
}

std::optional<int64_t> parse_count(std::string_view s) {
  constexpr size_t kMostDigits = 18;  // 10^18 - 1 < 2^63
  if (s.empty() || s.size() > kMostDigits) return std::nullopt;
  int64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace belay
