// The CPU backend: Eigen for matrix products (multi-threaded through OpenMP), plain
// OpenMP loops elsewhere, the element math of kernels/common. It is the reference every
// other backend is tested against.
#pragma once
#include "engine/backend.h"

namespace belay {

const Backend& cpu_backend();

}  // namespace belay
