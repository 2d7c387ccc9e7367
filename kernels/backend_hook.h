// A bench-only seam: route backend_for(Device::cpu()) through another Backend (bench/
// timed_backend.h wraps the CPU backend to time each call by op). Null, the default, means
// the CPU backend itself: one predictable branch per lookup when nobody uses it.
// Not thread-safe by design: set it on the main thread before any work and clear it after.
#pragma once
#include "engine/backend.h"

namespace belay {

void set_cpu_backend_override(const Backend* backend);  // nullptr: back to the CPU backend
const Backend& cpu_backend_direct();                     // the CPU backend, never the override

}  // namespace belay
