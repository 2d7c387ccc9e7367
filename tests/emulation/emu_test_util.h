// Host helpers for the emulator's own tests (test_simt.cu, test_runtime.cu): a CUDA call that
// must succeed, and device buffers to and from host vectors, through the emulated runtime.
#pragma once
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <vector>

#define REQUIRE_CUDA(call)                                                   \
  do {                                                                       \
    const cudaError_t belay_e = (call);                                      \
    INFO(#call << ": " << cudaGetErrorName(belay_e) << " ("                 \
               << cudaGetErrorString(belay_e) << ")");                       \
    REQUIRE(belay_e == cudaSuccess);                                         \
  } while (0)

namespace belay::emu_test {

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  REQUIRE_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = device_alloc<T>(host.size());
  REQUIRE_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> host(n);
  REQUIRE_CUDA(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace belay::emu_test
