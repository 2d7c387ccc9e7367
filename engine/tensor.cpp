#include "engine/tensor.h"

#include <atomic>

#include "engine/allocator.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

Storage::Storage(size_t bytes_, Device device_) : bytes(bytes_), device(device_) {
  ptr = allocator_for(device).allocate(bytes);
}

Storage::Storage(void* borrowed, size_t bytes_, std::shared_ptr<void> owner_)
    : ptr(borrowed), bytes(bytes_), device(Device::cpu()), owner(std::move(owner_)) {}

Storage::~Storage() {
  if (!owner) allocator_for(device).deallocate(ptr, bytes);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape.dims())
    if (d < 0) throw Error("negative dimension in shape " + shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.bytes(dtype_size(dtype))), device);
  return t;
}

Tensor Tensor::released() const {
  Tensor t;
  t.shape_ = shape_;
  t.dtype_ = dtype_;
  t.storage_ = std::make_shared<Storage>(nullptr, 0, std::make_shared<int>(0));
  t.storage_->device = device();
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  for (int64_t d : shape.dims())
    if (d < 0) throw Error("negative dimension in shape " + shape.str());
  if (!owner) throw Error("Tensor::borrow: an owner must keep the borrowed memory alive");
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0)
    throw Error(std::string("Tensor::borrow: memory not aligned to the size of ") + dtype_name(dtype));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape.bytes(dtype_size(dtype))), std::move(owner));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0f, dtype, device); }

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, Device device) {
  if (static_cast<int64_t>(values.size()) != shape.numel())
    throw Error("from_vector: " + std::to_string(values.size()) + " values do not fill shape " + shape.str());
  Tensor host = empty(shape, dtype, Device::cpu());
  for (size_t i = 0; i < values.size(); ++i) store_from_f32(host.data(), dtype, i, values[i]);
  return device.is_cpu() ? host : host.to(device);
}

namespace {
std::atomic<uint64_t> g_blocking_host_reads{0};
}  // namespace

uint64_t blocking_host_reads() { return g_blocking_host_reads.load(); }

std::vector<float> Tensor::to_vector() const {
  check_defined("to_vector", *this);
  g_blocking_host_reads.fetch_add(1);
  const Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_f32(host.data(), dtype_, i);
  return out;
}

float Tensor::item() const {
  if (numel() != 1) throw Error("item() needs a one-element tensor, got " + describe());
  return to_vector()[0];
}

Tensor Tensor::to(DType dtype) const {
  check_defined("to(dtype)", *this);
  Tensor out = empty(shape_, dtype, device());
  backend_for(device()).cast(*this, out);
  return out;
}

Tensor Tensor::to(Device target) const {
  check_defined("to(device)", *this);
  Tensor out = empty(shape_, dtype_, target);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::clone() const {
  check_defined("clone", *this);
  Tensor out = empty(shape_, dtype_, device());
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  check_defined("copy_from", src);
  check_same_shape("copy_from", *this, src);
  if (src.device() == device()) {
    backend_for(device()).cast(src, *this);
    return;
  }
  // Across devices: move the bytes as they are, then convert on the destination.
  const Device gpu = src.device().is_cpu() ? device() : src.device();
  Tensor staged = src.dtype() == dtype_ ? *this : empty(shape_, src.dtype(), device());
  backend_for(gpu).copy_bytes(staged.data(), device(), src.data(), src.device(), src.nbytes());
  if (staged.data() != data()) backend_for(device()).cast(staged, *this);
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape.numel() != numel())
    throw Error("reshape: cannot view " + describe() + " as " + shape.str() + " (element counts differ)");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::copy_rows(int64_t begin, int64_t end) const {
  check_defined("copy_rows", *this);
  if (rank() == 0 || begin < 0 || end < begin || end > dim(0))
    throw Error("copy_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") out of range for " +
                describe());
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = end - begin;
  Tensor out = empty(Shape(dims), dtype_, device());
  const size_t row_bytes = dim(0) ? nbytes() / static_cast<size_t>(dim(0)) : 0;
  backend_for(device()).copy_bytes(out.data(), device(), static_cast<const char*>(data()) + begin * row_bytes, device(),
                                   out.nbytes());
  return out;
}

void Tensor::fill(float value) {
  check_defined("fill", *this);
  backend_for(device()).fill(*this, value);
}

void Tensor::set_element(int64_t index, float value) {
  check_defined("set_element", *this);
  if (index < 0 || index >= numel())
    throw Error("set_element: index " + std::to_string(index) + " out of range for " + describe());
  Tensor one = Tensor::full(Shape{1}, value, dtype_, Device::cpu());
  const size_t size = dtype_size(dtype_);
  backend_for(device()).copy_bytes(static_cast<char*>(data()) + index * size, device(), one.data(), Device::cpu(), size);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device().str();
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw Error(std::string(op) + ": shape mismatch, " + a.describe() + " vs " + b.describe());
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device())
    throw Error(std::string(op) + ": device mismatch, " + a.describe() + " vs " + b.describe() +
                " (move one with .to(device))");
}

void check_dtype(const char* op, const Tensor& t, DType expected) {
  if (t.dtype() != expected)
    throw Error(std::string(op) + ": expected " + dtype_name(expected) + ", got " + t.describe());
}

void check_defined(const char* op, const Tensor& t) {
  if (!t.defined()) throw Error(std::string(op) + ": tensor is undefined");
}

void check_device_kind(const char* op, const Tensor& t, DeviceKind kind) {
  check_defined(op, t);
  if (t.device().kind != kind)
    throw Error(std::string(op) + ": " + (kind == DeviceKind::CPU ? "CPU" : "CUDA") + " backend given " + t.describe());
}

void check_f32_scalar(const char* op, const Tensor& t, DeviceKind kind) {
  check_device_kind(op, t, kind);
  if (t.numel() != 1 || t.dtype() != DType::F32)
    throw Error(std::string(op) + ": expected an fp32 one-element tensor, got " + t.describe());
}

}  // namespace belay
