#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace belay {
namespace {

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  return p;
}
void device_free(void* p) { cudaFree(p); }

[[noreturn]] void not_yet(const char* op) {
  throw Error(std::string("cuda backend: ") + op + " is not implemented yet; run with --device cpu");
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  RawMemory raw_memory() const override { return {device_alloc, device_free}; }

  void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) const override {
    BELAY_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  }
  void synchronize() const override { BELAY_CUDA_CHECK(cudaDeviceSynchronize()); }

  void cast(const Tensor& src, Tensor& dst) const override {
    check_same_device("cast", src, dst);
    if (src.numel() != dst.numel()) throw Error("cast: element counts differ, " + src.describe() + " vs " + dst.describe());
    launch_cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), nullptr);
    BELAY_CUDA_CHECK(cudaGetLastError());
  }
  void fill(Tensor& t, float value) const override {
    launch_fill(t.data(), t.dtype(), t.numel(), value, nullptr);
    BELAY_CUDA_CHECK(cudaGetLastError());
  }

  void binary(BinaryOp, const Tensor&, const Tensor&, Tensor&) const override { not_yet("binary"); }
  void scale(const Tensor&, float, Tensor&) const override { not_yet("scale"); }
  void accumulate(Tensor&, const Tensor&, float, const Tensor*) const override { not_yet("accumulate"); }
  void broadcast_scalar(const Tensor&, float, Tensor&) const override { not_yet("broadcast_scalar"); }
  void activation(Activation, const Tensor&, Tensor&) const override { not_yet("activation"); }
  void activation_backward(Activation, const Tensor&, const Tensor&, Tensor&) const override {
    not_yet("activation_backward");
  }
  void gemm(const GemmArgs&) const override { not_yet("gemm"); }
  void sum_rows(const Tensor&, Tensor&, bool) const override { not_yet("sum_rows"); }
  void sum(const Tensor&, Tensor&) const override { not_yet("sum"); }
  void mse_forward(const Tensor&, const Tensor&, Tensor&) const override { not_yet("mse_loss"); }
  void mse_backward(const Tensor&, const Tensor&, const Tensor&, Tensor&) const override { not_yet("mse_loss"); }
  void cross_entropy(const Tensor&, const Tensor&, Tensor&, Tensor&) const override { not_yet("cross_entropy"); }
  void guard(const std::vector<const Tensor*>&, const Tensor&, Tensor&, Tensor&) const override { not_yet("guard"); }
  void clip_coefficient(const Tensor&, float, Tensor&, Tensor&) const override { not_yet("clip_coefficient"); }
  void unscale_inplace(const std::vector<Tensor*>&, const Tensor&, Tensor&) const override { not_yet("unscale"); }
  void scale_inplace(const std::vector<Tensor*>&, const Tensor&) const override { not_yet("scale_inplace"); }
  void clamp_inplace(Tensor&, float, float) const override { not_yet("clamp"); }
  void adamw(const AdamWHyper&, const std::vector<AdamWSlot>&, const Tensor&, const Tensor&,
             const Tensor&) const override {
    not_yet("adamw");
  }
  void sgd(float, float, const std::vector<SgdSlot>&, const Tensor&, const Tensor&, const Tensor&) const override {
    not_yet("sgd");
  }
  void scaler_update(const ScalerConfig&, Tensor&, Tensor&, Tensor&, const Tensor&) const override {
    not_yet("scaler_update");
  }
};

}  // namespace

int cuda_visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

const Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

}  // namespace belay
