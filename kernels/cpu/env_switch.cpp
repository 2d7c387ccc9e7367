#include "kernels/cpu/env_switch.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/error.h"

namespace belay {

int env_switch(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  int at = 0;
  std::string expected;
  for (const char* value : values) {
    if (std::strcmp(v, value) == 0) return at;
    expected += (at == 0 ? "" : at + 1 == static_cast<int>(values.size()) ? " or " : ", ") + std::string(value);
    ++at;
  }
  throw UsageError(std::string(name) + "=" + v + ": expected " + expected);
}

}  // namespace belay
