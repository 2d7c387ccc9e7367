// The device -> backend lookup that engine/backend.h declares. The CUDA backend exists
// only in a CUDA build (BELAY_HAVE_CUDA) and is usable only when a GPU is visible.
#include "engine/backend.h"
#include "kernels/backend_hook.h"
#include "engine/error.h"
#include "kernels/cpu/cpu_backend.h"

#if BELAY_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace belay {

bool cuda_compiled() { return BELAY_HAVE_CUDA != 0; }

int cuda_device_count() {
#if BELAY_HAVE_CUDA
  return cuda_visible_devices();
#else
  return 0;
#endif
}

void require_device(Device device) {
  if (device.is_cpu()) return;
  // One GPU for now: the CUDA backend runs on the current device (0). Refused rather than
  // silently run on cuda:0.
  if (device.index > 0)
    throw UsageError("--device " + device.str() + ": only cuda:0 is supported so far (one GPU per process)");
  if (!cuda_compiled())
    throw UsageError("--device " + device.str() + ": this belay was built without CUDA (nvcc was not found at configure time)");
  const int n = cuda_device_count();
  if (n == 0) throw UsageError("--device " + device.str() + ": no CUDA GPU is visible (no device or no driver)");
  if (device.index >= n)
    throw UsageError("--device " + device.str() + ": only " + std::to_string(n) + " CUDA device(s) visible");
}

namespace {
const Backend* g_cpu_override = nullptr;  // kernels/backend_hook.h: the bench's per-op timer
}  // namespace

void set_cpu_backend_override(const Backend* backend) { g_cpu_override = backend; }
const Backend& cpu_backend_direct() { return cpu_backend(); }

const Backend& backend_for(Device device) {
  if (device.is_cpu()) return g_cpu_override ? *g_cpu_override : cpu_backend();
#if BELAY_HAVE_CUDA
  require_device(device);
  return cuda_backend();
#else
  require_device(device);
  throw Error("unreachable");
#endif
}

}  // namespace belay
