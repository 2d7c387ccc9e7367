// Tensor, Shape, Device and the caching allocator: what a user can get wrong is reported as
// belay::Error (bad arguments as UsageError) with a message naming the problem.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <vector>
#include <string>

#include "autograd/ops.h"
#include "engine/allocator.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/tensor.h"

using namespace belay;
using Catch::Contains;

TEST_CASE("shapes: rank, numel, printing, equality", "[engine][tensor]") {
  const Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s[1] == 3);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{5, 0}.numel() == 0);
  CHECK(s == Shape(std::vector<int64_t>{2, 3, 4}));
  CHECK(s != Shape{4, 3, 2});

  const Tensor t = Tensor::zeros(Shape{32, 8}, DType::F16);
  CHECK(t.numel() == 256);
  CHECK(t.nbytes() == 512);
  CHECK(t.rank() == 2);
  CHECK(t.dim(0) == 32);
  CHECK(t.dtype() == DType::F16);
  CHECK(t.device() == Device::cpu());
  CHECK(t.describe() == "fp16[32, 8] on cpu");
  CHECK(Tensor().describe() == "undefined tensor");
  CHECK_FALSE(Tensor().defined());
  CHECK(Tensor::zeros(Shape{3}, DType::BF16).nbytes() == 6);
}

TEST_CASE("bad shapes are Errors that say what is wrong", "[engine][tensor]") {
  CHECK_THROWS_AS(Tensor::empty(Shape{2, -1}), Error);
  CHECK_THROWS_WITH(Tensor::empty(Shape{2, -1}), Contains("negative dimension") && Contains("[2, -1]"));
  CHECK_THROWS_WITH(Tensor::from_vector({1, 2, 3}, Shape{2, 2}), Contains("3 values") && Contains("[2, 2]"));
  CHECK_THROWS_WITH(Tensor::zeros(Shape{2, 2}).item(), Contains("one-element"));

  // Shape mismatch, through an op and through the engine's check.
  const Var a(Tensor::zeros(Shape{2, 3})), b(Tensor::zeros(Shape{3, 2}));
  CHECK_THROWS_AS(add(a, b), Error);
  CHECK_THROWS_WITH(add(a, b), Contains("add") && Contains("shape mismatch") && Contains("fp32[2, 3]") &&
                                   Contains("fp32[3, 2]"));
  Tensor dst = Tensor::zeros(Shape{4});
  CHECK_THROWS_WITH(dst.copy_from(Tensor::zeros(Shape{5})), Contains("copy_from") && Contains("shape mismatch"));
  CHECK_THROWS_WITH(matmul(a, a), Contains("inner sizes differ"));
}

TEST_CASE("a shape whose element or byte count overflows is a UsageError, never a wrapped size", "[engine][tensor]") {
  const int64_t big = int64_t{1} << 62;
  // Element counts: every one of these wrapped (to 0, or negative) before it was checked.
  CHECK_THROWS_AS(Shape({int64_t{1} << 32, int64_t{1} << 32}), UsageError);
  CHECK_THROWS_WITH(Shape({3, big}), Contains("[3, 4611686018427387904]") && Contains("more elements than fit"));
  CHECK_THROWS_AS(Shape(std::vector<int64_t>{big, big, 0}), UsageError);  // a zero does not excuse the rest
  CHECK(Shape{0, big, 1}.numel() == 0);
  CHECK(Shape{big}.numel() == big);
  CHECK(Shape{INT64_MAX}.numel() == INT64_MAX);
  // Byte counts: 2^62 fp32 elements (2^64 bytes), 2^63 - 1 of them; every stride fits too.
  CHECK_THROWS_WITH(Shape{big}.bytes(4), Contains("[4611686018427387904]") && Contains("more than 2^63 bytes"));
  CHECK_THROWS_AS(Tensor::zeros(Shape{big}), UsageError);
  CHECK_THROWS_AS(Tensor::zeros(Shape{INT64_MAX}), UsageError);
  CHECK_THROWS_AS(Tensor::zeros(Shape{int64_t{1} << 31, int64_t{1} << 31}), UsageError);
  CHECK_THROWS_AS(Shape({0, big, 1}).bytes(2), UsageError);  // a stride of 2^63 bytes
  CHECK(Shape{0, int64_t{1} << 61}.bytes(2) == 0);
  CHECK(Shape{3, 5}.bytes(2) == 30);
}

TEST_CASE("a size that fits in 64 bits but not in memory is an Error with its bytes, not a crash",
          "[engine][tensor][allocator]") {
#if defined(__SANITIZE_ADDRESS__)
  WARN("CTEST_SKIP: ASan aborts on an impossible allocation instead of failing it");
  return;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  WARN("CTEST_SKIP: ASan aborts on an impossible allocation instead of failing it");
  return;
#endif
#endif
  // 2^60 fp32 elements, 2^62 bytes: the counts fit, no address space does.
  CHECK_THROWS_AS(Tensor::zeros(Shape{int64_t{1} << 60}), Error);
  CHECK_THROWS_WITH(Tensor::zeros(Shape{int64_t{1} << 60}),
                    Contains("out of memory allocating 4611686018427387904 bytes for a tensor"));
}

TEST_CASE("dtype mismatch is an Error naming both dtypes", "[engine][tensor]") {
  const Tensor h = Tensor::zeros(Shape{2, 2}, DType::F16);
  CHECK_THROWS_AS(check_dtype("op", h, DType::F32), Error);
  CHECK_THROWS_WITH(check_dtype("myop", h, DType::F32), Contains("myop") && Contains("expected fp32") &&
                                                            Contains("fp16[2, 2]"));
  // A matmul of different dtypes outside autocast says to cast or autocast.
  const Var a(Tensor::zeros(Shape{2, 2}, DType::F32)), b(h);
  CHECK_THROWS_WITH(matmul(a, b), Contains("dtypes differ") && Contains("run under autocast"));
  // The backend's gemm refuses operands of different dtypes.
  Tensor c = Tensor::zeros(Shape{2, 2});
  GemmArgs args;
  args.a = &a.value();
  args.b = &h;
  args.c = &c;
  CHECK_THROWS_WITH(backend_for(Device::cpu()).gemm(args), Contains("operand dtypes differ"));
  // Reductions write an FP32 output and say so.
  Tensor out16 = Tensor::zeros(Shape{2}, DType::F16);
  CHECK_THROWS_WITH(backend_for(Device::cpu()).sum_rows(h, out16, false), Contains("expected fp32"));
}

TEST_CASE("device errors: parse_device, require_device and tensors on a missing GPU", "[engine][tensor][device]") {
  CHECK(parse_device("cpu") == Device::cpu());
  CHECK(parse_device("cuda") == Device::cuda(0));
  CHECK(parse_device("cuda:3") == Device::cuda(3));
  CHECK(Device::cuda(2).str() == "cuda:2");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:12345", "CPU", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_device(bad), UsageError);
    CHECK_THROWS_WITH(parse_device(bad), Contains("unknown device"));
  }
  CHECK_NOTHROW(require_device(Device::cpu()));
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    // --device cuda without a GPU (or without a CUDA build): a usage error, and no tensor.
    CHECK_THROWS_AS(require_device(Device::cuda()), UsageError);
    CHECK_THROWS_WITH(require_device(Device::cuda()), Contains("--device cuda:0") &&
                                                          (Contains("without CUDA") || Contains("no CUDA GPU")));
    CHECK_THROWS_AS(Tensor::zeros(Shape{2}, DType::F32, Device::cuda()), UsageError);
    if (!cuda_compiled()) CHECK_THROWS_WITH(require_device(Device::cuda()), Contains("built without CUDA"));
  } else {
    CHECK_NOTHROW(require_device(Device::cuda(0)));
    CHECK_THROWS_AS(require_device(Device::cuda(gpus)), UsageError);
    // Device mismatch between a CPU and a GPU tensor.
    const Var a(Tensor::zeros(Shape{2})), b(Tensor::zeros(Shape{2}, DType::F32, Device::cuda()));
    CHECK_THROWS_WITH(add(a, b), Contains("device mismatch") && Contains("cpu") && Contains("cuda:0"));
  }
}

TEST_CASE("reshape shares storage, a wrong element count is an Error", "[engine][tensor]") {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor r = t.reshape(Shape{3, 2});
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.data() == t.data());
  r.set_element(5, 60.0f);
  CHECK(t.to_vector()[5] == 60.0f);
  CHECK(r.to_vector() == t.to_vector());
  CHECK_THROWS_AS(t.reshape(Shape{4, 2}), Error);
  CHECK_THROWS_WITH(t.reshape(Shape{4, 2}), Contains("reshape") && Contains("[4, 2]") && Contains("counts differ"));
}

TEST_CASE("copies share storage, clone does not", "[engine][tensor]") {
  Tensor t = Tensor::from_vector({1, 2, 3}, Shape{3});
  Tensor shared = t;
  shared.fill(7.0f);
  CHECK(t.to_vector() == std::vector<float>{7, 7, 7});
  Tensor c = t.clone();
  CHECK(c.data() != t.data());
  CHECK(c.to_vector() == t.to_vector());
  c.fill(1.0f);
  CHECK(t.to_vector() == std::vector<float>{7, 7, 7});
  CHECK(c.to_vector() == std::vector<float>{1, 1, 1});
}

TEST_CASE("to(dtype) rounds each element once, to(same dtype) is a copy", "[engine][tensor]") {
  const std::vector<float> v{1.001f, 70000.0f, 1e-6f, -0.1f, 0.0f};
  const Tensor t = Tensor::from_vector(v, Shape{5});
  for (DType d : {DType::F16, DType::BF16}) {
    const Tensor low = t.to(d);
    CHECK(low.dtype() == d);
    CHECK(low.shape() == t.shape());
    const std::vector<float> got = low.to_vector();
    for (size_t i = 0; i < v.size(); ++i) CHECK(got[i] == round_to(d, v[i]));
    // Back to FP32 is exact.
    CHECK(low.to(DType::F32).to_vector() == got);
  }
  CHECK(t.to(DType::F16).to_vector()[1] == INFINITY);
  CHECK(t.to(DType::BF16).to_vector()[1] == 70144.0f);
  const Tensor same = t.to(DType::F32);
  CHECK(same.data() != t.data());
  CHECK(same.to_vector() == t.to_vector());
  // from_vector rounds into its dtype too.
  CHECK(Tensor::from_vector({1.001f}, Shape{1}, DType::F16).item() == 1.0009765625f);
  // copy_from converts.
  Tensor dst = Tensor::zeros(Shape{5}, DType::BF16);
  dst.copy_from(t);
  CHECK(dst.to_vector() == t.to(DType::BF16).to_vector());
}

TEST_CASE("set_element writes one element rounded into the dtype", "[engine][tensor]") {
  Tensor t = Tensor::zeros(Shape{2, 3}, DType::F16);
  t.set_element(4, 1.001f);
  t.set_element(0, INFINITY);
  const std::vector<float> got = t.to_vector();
  CHECK(got[4] == 1.0009765625f);
  CHECK(got[0] == INFINITY);
  for (int i : {1, 2, 3, 5}) CHECK(got[i] == 0.0f);
  CHECK_THROWS_WITH(t.set_element(6, 1.0f), Contains("index 6 out of range") && Contains("fp16[2, 3]"));
  CHECK_THROWS_AS(t.set_element(-1, 1.0f), Error);
  Tensor f = Tensor::zeros(Shape{3});
  f.set_element(2, 1.001f);
  CHECK(f.to_vector()[2] == 1.001f);
  CHECK(Tensor::full(Shape{2}, 3.5f, DType::BF16).to_vector() == std::vector<float>{3.5f, 3.5f});
}

TEST_CASE("the caching allocator: a steady-state loop asks the system for nothing", "[engine][tensor][allocator]") {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const Backend& be = backend_for(Device::cpu());
  auto one_step = [&] {
    Tensor a = Tensor::full(Shape{64, 32}, 0.5f);
    Tensor b = Tensor::full(Shape{32, 16}, 0.25f, DType::F16);
    Tensor a16 = a.to(DType::F16);
    Tensor c = Tensor::empty(Shape{64, 16});
    GemmArgs args;
    args.a = &a16;
    args.b = &b;
    args.c = &c;
    be.gemm(args);
    Tensor s = Tensor::empty(Shape{1});
    be.sum(c, s);
    return s.item();
  };
  const float first = one_step();  // warms the cache
  CHECK(first == 64.0f * 16.0f * 32.0f * 0.125f);
  const AllocatorStats before = alloc.stats();
  for (int i = 0; i < 10; ++i) REQUIRE(one_step() == first);
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.requests > before.requests);  // the loop did allocate, from the cache
  CHECK(after.bytes_in_use == before.bytes_in_use);

  // A block of a new size is a system allocation once, then cached.
  const uint64_t sys0 = alloc.stats().system_allocs;
  { Tensor odd = Tensor::empty(Shape{12345}); }
  const uint64_t sys1 = alloc.stats().system_allocs;
  CHECK(sys1 == sys0 + 1);
  CHECK(alloc.stats().bytes_cached >= 12345 * 4);
  { Tensor odd = Tensor::empty(Shape{12345}); }
  CHECK(alloc.stats().system_allocs == sys1);
}

TEST_CASE("a CachingAllocator counts requests, misses, bytes in use and the peak", "[engine][allocator]") {
  static int allocs = 0, frees = 0;
  allocs = frees = 0;
  RawMemory raw{[](size_t n) -> void* { ++allocs; return ::operator new(n); },
                [](void* p) { ++frees; ::operator delete(p); }};
  CachingAllocator a(raw);
  void* p = a.allocate(100);
  void* q = a.allocate(200);
  CHECK(a.stats().bytes_in_use == 300);
  CHECK(a.stats().peak_bytes_in_use == 300);
  a.deallocate(p, 100);
  CHECK(a.stats().bytes_in_use == 200);
  CHECK(a.stats().bytes_cached == 100);
  void* p2 = a.allocate(100);
  CHECK(p2 == p);  // reused
  CHECK(a.stats().system_allocs == 2);
  CHECK(a.stats().requests == 3);
  CHECK(allocs == 2);
  a.deallocate(p2, 100);
  a.deallocate(q, 200);
  CHECK(a.stats().bytes_in_use == 0);
  CHECK(a.stats().peak_bytes_in_use == 300);
  a.release_cached();
  CHECK(frees == 2);
  CHECK(a.stats().bytes_cached == 0);
}

TEST_CASE("a CachingAllocator that the system refuses empties its cache and tries once more", "[engine][allocator]") {
  // A system with room for `capacity` bytes that knows the size of each block it gave.
  static std::map<void*, size_t> live;
  static size_t capacity = 0, used = 0;
  static int frees = 0;
  live.clear();
  capacity = 300;
  used = 0;
  frees = 0;
  RawMemory raw{[](size_t n) -> void* {
                  if (used + n > capacity) return nullptr;
                  void* p = ::operator new(n);
                  live[p] = n;
                  used += n;
                  return p;
                },
                [](void* p) {
                  used -= live.at(p);
                  live.erase(p);
                  ++frees;
                  ::operator delete(p);
                }};
  CachingAllocator a(raw);
  void* p = a.allocate(100);
  void* q = a.allocate(150);
  a.deallocate(p, 100);
  a.deallocate(q, 150);
  CHECK(a.stats().bytes_cached == 250);
  // 200 bytes: the system has 50 left while 250 sit in the cache, so the cache is given back
  // and the request tried again.
  void* r = a.allocate(200);
  CHECK(r != nullptr);
  CHECK(frees == 2);
  CHECK(a.stats().bytes_cached == 0);
  CHECK(a.stats().bytes_in_use == 200);
  CHECK(a.stats().system_allocs == 3);
  // Nothing cached and no room: a clear error, and the books unchanged.
  try {
    a.allocate(101);
    FAIL("expected an out-of-memory error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "out of memory allocating 101 bytes for a tensor (200 bytes in use, nothing cached)");
  }
  CHECK(a.stats().bytes_in_use == 200);
  CHECK(a.stats().system_allocs == 3);
  a.deallocate(r, 200);
  a.release_cached();
  CHECK(used == 0);
}

TEST_CASE("a borrowed tensor reads the owner's memory, never frees it, and drops the owner last", "[engine][tensor]") {
  auto memory = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = memory;
  const AllocatorStats before = allocator_for(Device::cpu()).stats();
  {
    Tensor t = Tensor::borrow(memory->data(), Shape{2, 3}, DType::F32, memory);
    memory.reset();  // the tensor keeps it alive
    CHECK(t.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
    (*watch.lock())[4] = 50.0f;  // no copy: a write to the owner's memory shows
    CHECK(t.to_vector()[4] == 50.0f);
    Tensor shared = t.reshape(Shape{6});
    t = Tensor();
    CHECK_FALSE(watch.expired());  // still held through the reshape
    CHECK(shared.numel() == 6);
  }
  CHECK(watch.expired());
  CHECK(allocator_for(Device::cpu()).stats().bytes_in_use == before.bytes_in_use);  // never the allocator's
  uint16_t halves[3] = {0, 0, 0};
  auto owner = std::make_shared<int>(0);
  CHECK_THROWS_WITH(Tensor::borrow(reinterpret_cast<char*>(halves) + 1, Shape{1}, DType::F16, owner),
                    Contains("not aligned"));
  CHECK_THROWS_WITH(Tensor::borrow(halves, Shape{1}, DType::F16, nullptr), Contains("owner"));
}
