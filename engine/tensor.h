// A dense, contiguous, row-major tensor: shape, dtype, device and a reference-counted
// storage that comes from the device's caching allocator. Tensors share storage on
// copy (like torch.Tensor); clone() makes an independent copy.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/shape.h"

namespace belay {

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  // Set for borrowed host memory (a NumPy array's buffer): released by dropping the owner,
  // never given to the allocator.
  std::shared_ptr<void> owner;
  Storage(size_t bytes, Device device);
  Storage(void* borrowed, size_t bytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype = DType::F32, Device device = Device::cpu());
  // Values are rounded into `dtype`.
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32,
                            Device device = Device::cpu());
  // A tensor over host memory it does not own (no copy): `owner` keeps the memory alive and is
  // dropped with the last tensor sharing it. The memory must be contiguous, row-major and
  // aligned to the dtype's size.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);
  static Tensor scalar(float value, DType dtype = DType::F32, Device device = Device::cpu()) {
    return from_vector({value}, Shape{1}, dtype, device);
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t rank() const { return shape_.rank(); }
  int64_t dim(size_t i) const { return shape_[i]; }

  void* data() const { return storage_ ? storage_->ptr : nullptr; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data()); }

  // Host-side views, converting through FP32 (copies from the device when needed).
  std::vector<float> to_vector() const;
  float item() const;  // a one-element tensor's value

  Tensor to(DType dtype) const;    // a converted copy (a new tensor even when dtype matches)
  Tensor to(Device device) const;  // a copy on another device
  Tensor clone() const;
  void copy_from(const Tensor& src);  // same shape; converts dtype; crosses devices
  Tensor reshape(const Shape& shape) const;  // shares storage; numel must match
  // The same shape, dtype and device without the memory (data() is null): what autograd keeps
  // of a value no backward reads any more, so gradients can still be shaped from it.
  Tensor released() const;
  Tensor copy_rows(int64_t begin, int64_t end) const;  // a new tensor: rows [begin, end) of dim 0
  void fill(float value);
  void set_element(int64_t index, float value);  // one element, rounded into dtype (tests, fault injection)

  std::string describe() const;  // "fp16[32, 8] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
};

// How many times the host has waited for a tensor's values (to_vector, item, and so
// to(cpu) of a device tensor's values read on the host). A training step must not: on a GPU
// each one is a synchronisation. Tests read this counter around a step to prove it.
uint64_t blocking_host_reads();

// Checks that throw belay::Error naming the operation and what did not match.
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_dtype(const char* op, const Tensor& t, DType expected);
void check_defined(const char* op, const Tensor& t);
// A backend's own checks: the tensor lives on this backend's kind of device; a one-element
// FP32 tensor (the device scalars of a step: scale, found_inf, clip coefficient, ...).
void check_device_kind(const char* op, const Tensor& t, DeviceKind kind);
void check_f32_scalar(const char* op, const Tensor& t, DeviceKind kind);

}  // namespace belay
