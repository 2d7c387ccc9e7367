// The fields of the text files belay writes and reads again (step logs, census files,
// checkpoint settings, data positions, token ids): one split for a CSV line and one reading of
// a count, where each reader had its own and they disagreed (one split dropped a last empty
// field, one step parser took "+4" and " 4", another only digits, one resume took any text as
// step 0).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace belay {

// The fields of a comma-separated line as belay writes them (no quoting: belay's fields never
// hold a comma), every one kept: "a,,b," is four fields, the last one empty.
std::vector<std::string> split_fields(std::string_view line);

// A count as belay writes one (std::to_string of a non-negative integer): decimal digits only,
// no sign, space, point or exponent, at most 18 of them (so any fits int64_t). Empty where `s`
// is not one.
std::optional<int64_t> parse_count(std::string_view s);

}  // namespace belay
