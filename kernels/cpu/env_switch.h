// The CPU backend's switches read from the environment (BELAY_GEMM_BLOCKING, BELAY_GEMM_TILE,
// BELAY_HUGE_PAGES): one parser, so each reads and refuses a value the same way.
#pragma once
#include <initializer_list>

namespace belay {

// Which of `values` the variable `name` holds: 0 (the first, the default) when it is unset or
// empty. Any other value is a UsageError, "NAME=value: expected a, b or c".
int env_switch(const char* name, std::initializer_list<const char*> values);

}  // namespace belay
