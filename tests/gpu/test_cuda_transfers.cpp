// CUDA copy_bytes: host -> device returns before the GPU has run the copy (it is staged in
// pinned memory), so the caller may overwrite or free its source at once and the original
// bytes must still land; device -> host waits and sees everything enqueued before it;
// device -> device is enqueued in order.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {


std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Device memory of at least `bytes` (whole floats), from the caching allocator.
Tensor device_bytes(size_t bytes) {
  return Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, DType::F32, Device::cuda());
}

std::vector<uint8_t> download(const Tensor& t, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  gpu().copy_bytes(out.data(), Device::cpu(), t.data(), Device::cuda(), bytes);
  return out;
}

}  // namespace

TEST_CASE("cuda host->device copy lands the original bytes though the source is overwritten at once",
          "[gpu][transfer]") {
  BELAY_REQUIRE_GPU();
  BusyWork busy;
  // One byte, an odd size, a small tensor, a batch (16 MiB, staged) and one past the staging
  // limit (64 MiB + 3, copied synchronously): each overwritten right after copy_bytes returns.
  for (size_t bytes : {size_t{1}, size_t{7}, size_t{4096}, size_t{16} << 20, (size_t{64} << 20) + 3}) {
    const std::vector<uint8_t> want = pattern(bytes, static_cast<uint32_t>(bytes));
    std::vector<uint8_t> src = want;
    Tensor dst = device_bytes(bytes);
    busy.enqueue();
    gpu().copy_bytes(dst.data(), Device::cuda(), src.data(), Device::cpu(), bytes);
    std::fill(src.begin(), src.end(), uint8_t{0xAB});
    src.clear();
    src.shrink_to_fit();  // freed, too
    INFO(bytes << " bytes");
    CHECK(download(dst, bytes) == want);
  }
}

TEST_CASE("cuda: many uploads in flight, each from a reused host buffer, all land", "[gpu][transfer]") {
  BELAY_REQUIRE_GPU();
  BusyWork busy;
  busy.enqueue();
  // More uploads than staging buffers, of growing sizes, all from one host buffer rewritten
  // between them, while the GPU is still busy: the staging ring grows, then waits for its
  // oldest copy; never may a staging buffer be overwritten before its copy has run.
  std::vector<uint8_t> src;
  std::vector<std::vector<uint8_t>> want;
  std::vector<Tensor> dst;
  for (int i = 0; i < 24; ++i) {
    const size_t bytes = 1000 + static_cast<size_t>(i) * 37'001;
    want.push_back(pattern(bytes, 7 + i));
    src = want.back();
    dst.push_back(device_bytes(bytes));
    gpu().copy_bytes(dst.back().data(), Device::cuda(), src.data(), Device::cpu(), bytes);
    if (i % 8 == 7) busy.enqueue();
  }
  for (size_t i = 0; i < dst.size(); ++i) {
    INFO("upload " << i);
    CHECK(download(dst[i], want[i].size()) == want[i]);
  }
}

TEST_CASE("cuda tensor uploads through from_vector, copy_from and set_element keep their values",
          "[gpu][transfer]") {
  BELAY_REQUIRE_GPU();
  BusyWork busy;
  busy.enqueue();
  const std::vector<float> v = random_values(1000, 601);
  Tensor host = Tensor::from_vector(v, Shape{1000}, DType::F32, Device::cpu());
  Tensor dev = Tensor::empty(Shape{1000}, DType::F32, Device::cuda());
  dev.copy_from(host);
  host.fill(-5.0f);  // the host tensor changes right after: the device copy must not
  // A converting upload (FP32 on the host into BF16 on the GPU: bytes staged, then a cast).
  Tensor dev16 = Tensor::empty(Shape{1000}, DType::BF16, Device::cuda());
  Tensor host2 = Tensor::from_vector(v, Shape{1000}, DType::F32, Device::cpu());
  dev16.copy_from(host2);
  host2.fill(9.0f);
  // from_vector on the GPU uploads from a temporary that is gone when it returns.
  Tensor direct = Tensor::from_vector(v, Shape{1000}, DType::F32, Device::cuda());
  dev.set_element(3, 42.0f);  // from a one-element temporary as well
  std::vector<float> want = v;
  want[3] = 42.0f;
  CHECK(dev.to_vector() == want);
  CHECK(direct.to_vector() == v);
  std::vector<float> want16(v.size());
  for (size_t i = 0; i < v.size(); ++i) want16[i] = round_to(DType::BF16, v[i]);
  CHECK(dev16.to_vector() == want16);
}

TEST_CASE("cuda device->device copies are ordered with the kernels around them", "[gpu][transfer]") {
  BELAY_REQUIRE_GPU();
  const std::vector<float> v = random_values(4 * 129, 701);
  Pair x = make_pair(v, Shape{4, 129}, DType::F32);
  Tensor rows = x.device.copy_rows(1, 3);  // a device->device copy
  gpu().fill(x.device, 0.0f);               // enqueued after it: must not reach the copy
  const std::vector<float> want(v.begin() + 129, v.begin() + 3 * 129);
  CHECK(rows.to_vector() == want);
  Tensor copy = rows.clone();  // same device: a cast kernel, then copy_bytes to the host
  CHECK(copy.to_vector() == want);
  // Zero bytes: nothing to do in any direction.
  gpu().copy_bytes(rows.data(), Device::cuda(), nullptr, Device::cpu(), 0);
  gpu().copy_bytes(nullptr, Device::cpu(), rows.data(), Device::cuda(), 0);
  CHECK(rows.to_vector() == want);
}
