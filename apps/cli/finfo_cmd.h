// `belay finfo`: the dtype table and how given values round.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace belay {

int run_finfo(const std::vector<std::string>& values, std::ostream& out);

}  // namespace belay
