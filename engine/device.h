// Where a tensor lives. The CPU always exists; CUDA exists when belay was built with
// CUDA and a GPU is visible at run time (kernels decide that, see engine/backend.h).
#pragma once
#include <string>

namespace belay {

enum class DeviceKind { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

Device parse_device(const std::string& name);  // "cpu", "cuda", "cuda:N"; throws UsageError

}  // namespace belay
