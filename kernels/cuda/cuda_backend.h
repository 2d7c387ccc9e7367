// The CUDA backend: hand-written kernels behind the op table. Host code may include this
// header; the kernels live in .cu files next to it.
#pragma once
#include "engine/backend.h"

namespace belay {

int cuda_visible_devices();  // 0 on any CUDA error (no driver, no device)
const Backend& cuda_backend();

}  // namespace belay
