// What both kinds of `belay validate` (validate.cpp, validate_gpt.cpp) share to build their
// report: the verdict block and the conclusion. A header of its own so that JSON stays out of
// validate.h, which the CLI's files include.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/run/validate.h"

namespace belay {

// One threshold's outcome, and the verdict block both kinds of checkpoint print: a PASS or
// FAIL line per check under "verdict:", the same as the report's "checks" array (returned);
// `pass` is whether every check holds.
struct ValidateCheck {
  const char* name;
  bool pass;
  std::string detail;
};
nlohmann::json print_checks(const std::vector<ValidateCheck>& checks, bool& pass, std::ostream& out);

// The verdict line ("PASS: bf16 holds every threshold on this <what>"), the JSON report
// written when asked (atomically), and the result: shared by both kinds of checkpoint.
ValidateResult conclude_validate(bool pass, const ValidateConfig& config, nlohmann::json report, const char* what,
                                 std::ostream& out);

}  // namespace belay
