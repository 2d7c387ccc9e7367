// The CUDA ops that let a step run with no host read: lookup (the LR picked by the device
// count), count_applied, AdamW and SGD reading lr and the count from device memory, and
// read_async (snapshots of device scalars, waited for only when the host asks). Each against
// the CPU backend where there is one.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/error.h"
#include "tests/gpu/gpu_test_util.h"

using namespace belay;
using namespace belay::test;

namespace {

Tensor dev_scalar(float v) { return Tensor::scalar(v, DType::F32, Device::cuda()); }


}  // namespace

TEST_CASE("cuda lookup picks the CPU's entry: first, middle, last and past the end", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
    Pair table = make_pair(Shape{n}, DType::F32, 300 + n, 0.0f, 1.0f);
    for (float index : {0.0f, static_cast<float>(n / 2), static_cast<float>(n - 1), static_cast<float>(n),
                        static_cast<float>(n + 5), 16777216.0f}) {
      Tensor ig = dev_scalar(index), ic = Tensor::scalar(index);
      Tensor og = dev_scalar(-1.0f), oc = Tensor::scalar(-1.0f);
      gpu().lookup(table.device, ig, og);
      cpu().lookup(table.host, ic, oc);
      INFO("n = " << n << ", index " << index);
      const std::vector<float> t = table.host.to_vector();
      const int64_t want = static_cast<int64_t>(index) < n ? static_cast<int64_t>(index) : n - 1;
      CHECK(f32_bits(oc.item()) == f32_bits(t[static_cast<size_t>(want)]));
      CHECK(f32_bits(og.item()) == f32_bits(oc.item()));
    }
  }
  // What the host can check, it does: an empty table, or scalars that are not FP32 [1] on the GPU.
  Tensor empty = Tensor::empty(Shape{0}, DType::F32, Device::cuda());
  Tensor i0 = dev_scalar(0.0f), out = dev_scalar(0.0f);
  CHECK_THROWS_AS(gpu().lookup(empty, i0, out), Error);
  Tensor table = Tensor::zeros(Shape{4}, DType::F32, Device::cuda());
  Tensor host_index = Tensor::scalar(0.0f);
  CHECK_THROWS_AS(gpu().lookup(table, host_index, out), Error);
  Tensor two = Tensor::zeros(Shape{2}, DType::F32, Device::cuda());
  CHECK_THROWS_AS(gpu().lookup(table, i0, two), Error);
}

TEST_CASE("cuda count_applied moves the count only for an applied step, as the CPU does", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  Tensor cg = dev_scalar(5.0f), cc = Tensor::scalar(5.0f);
  for (float found : {0.0f, 1.0f, 0.0f, 0.0f, NAN, 1.0f, 0.0f}) {
    Tensor fg = dev_scalar(found), fc = Tensor::scalar(found);
    gpu().count_applied(cg, fg);
    cpu().count_applied(cc, fc);
    INFO("found_inf " << found);
    CHECK(cg.item() == cc.item());
  }
  CHECK(cg.item() == 9.0f);  // four applied steps
  Tensor f16 = Tensor::scalar(0.0f, DType::F16, Device::cuda()), f = dev_scalar(0.0f);
  CHECK_THROWS_AS(gpu().count_applied(cg, f16), Error);
  CHECK_THROWS_AS(gpu().count_applied(f16, f), Error);
}

TEST_CASE("cuda adamw and sgd read lr and the applied count from device memory", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  const int64_t n = 1000;
  const std::vector<float> p0 = random_values(n, 401, -1.0f, 1.0f);
  const std::vector<float> m0 = random_values(n, 402, -0.1f, 0.1f);
  const std::vector<float> v0 = random_values(n, 403, 0.001f, 0.01f);
  const std::vector<float> g0 = random_values(n, 404, -2048.0f, 2048.0f, DType::F16);
  const AdamWHyper h;
  const float lr = 1e-3f;
  // Late counts too: the bias corrections come from a count far from 1 (FP64 pow on each side).
  for (float applied : {0.0f, 9.0f, 999.0f, 99999.0f}) {
    std::vector<Tensor> p, m, v, g;
    for (const Device d : {Device::cpu(), Device::cuda()}) {
      p.push_back(Tensor::from_vector(p0, Shape{n}, DType::F32, d));
      m.push_back(Tensor::from_vector(m0, Shape{n}, DType::F32, d));
      v.push_back(Tensor::from_vector(v0, Shape{n}, DType::F32, d));
      g.push_back(Tensor::from_vector(g0, Shape{n}, DType::F16, d));
    }
    for (int dev = 0; dev < 2; ++dev) {
      const Device d = dev ? Device::cuda() : Device::cpu();
      const Tensor inv = Tensor::scalar(1.0f / 1024.0f, DType::F32, d), coef = Tensor::scalar(0.5f, DType::F32, d);
      const Tensor zero = Tensor::scalar(0.0f, DType::F32, d), lr_t = Tensor::scalar(lr, DType::F32, d);
      const Tensor count = Tensor::scalar(applied, DType::F32, d);
      const Backend& be = dev ? gpu() : cpu();
      be.adamw(h, {{&p[dev], &m[dev], &v[dev], &g[dev], nullptr, 0.01f}}, {&inv, &coef, &zero, &lr_t, &count});
    }
    INFO("applied " << applied);
    // ~16 FP32 roundings; the update is at most ~lr * |m_hat| / sqrt(v_hat) <= ~30 lr here.
    const Tolerance t = tolerance_for(DType::F32, DType::F32, 16);
    const std::vector<double> pc = as_double(p[0]);
    std::vector<double> mag(pc.size());
    for (size_t i = 0; i < pc.size(); ++i) mag[i] = std::fabs(pc[i]) + 30.0 * lr;
    check_close(p[1].to_vector(), pc, {2.0 * t.rel, 2.0 * t.abs}, mag);
    check_close(m[1].to_vector(), as_double(m[0]), {2.0 * t.rel, 2.0 * t.abs});
    check_close(v[1].to_vector(), as_double(v[0]), {2.0 * t.rel, 2.0 * t.abs});
  }

  // lr is read when the kernel runs, not when it is enqueued: a device lr set to 0 by an
  // earlier kernel leaves the masters (no decay: wd = 0) unchanged, bit for bit.
  Tensor p = Tensor::from_vector(p0, Shape{n}, DType::F32, Device::cuda());
  Tensor m = Tensor::zeros(Shape{n}, DType::F32, Device::cuda()), v = Tensor::zeros(Shape{n}, DType::F32, Device::cuda());
  Tensor g = Tensor::from_vector(g0, Shape{n}, DType::F16, Device::cuda());
  Tensor inv = dev_scalar(1.0f), coef = dev_scalar(1.0f), zero = dev_scalar(0.0f), lr_g = dev_scalar(0.5f);
  Tensor count = dev_scalar(0.0f);
  gpu().fill(lr_g, 0.0f);
  gpu().adamw(h, {{&p, &m, &v, &g, nullptr, 0.0f}}, {&inv, &coef, &zero, &lr_g, &count});
  gpu().sgd(0.9f, {{&p, &m, &g, nullptr, 0.0f}}, {&inv, &coef, &zero, &lr_g, &count});
  const std::vector<float> after = p.to_vector();
  size_t moved = 0;
  for (size_t i = 0; i < after.size(); ++i) moved += f32_bits(after[i]) != f32_bits(p0[i]);
  CHECK(moved == 0);
  // A missing step scalar is a clear error, not a crash.
  CHECK_THROWS_AS(gpu().adamw(h, {{&p, &m, &v, &g, nullptr, 0.0f}}, {&inv, &coef, &zero, &lr_g, nullptr}), Error);
  CHECK_THROWS_AS(gpu().sgd(0.9f, {{&p, &m, &g, nullptr, 0.0f}}, {&inv, &coef, &zero, nullptr, &count}), Error);
}

TEST_CASE("cuda: lookup, adamw and count_applied run steps with no host read, as the CPU does", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  const int64_t n = 129;
  const std::vector<float> p0 = random_values(n, 501, -1.0f, 1.0f);
  const std::vector<float> schedule{1e-2f, 5e-3f, 2.5e-3f};  // the last entry holds after
  const float found_pattern[] = {0, 1, 0, 0, 1, 0, 0};
  std::vector<Tensor> p, m, v, g, table, count, lr, inv, coef;
  for (const Device d : {Device::cpu(), Device::cuda()}) {
    p.push_back(Tensor::from_vector(p0, Shape{n}, DType::F32, d));
    m.push_back(Tensor::zeros(Shape{n}, DType::F32, d));
    v.push_back(Tensor::zeros(Shape{n}, DType::F32, d));
    g.push_back(Tensor::from_vector(random_values(n, 502, -1.0f, 1.0f), Shape{n}, DType::F32, d));
    table.push_back(Tensor::from_vector(schedule, Shape{3}, DType::F32, d));
    count.push_back(Tensor::scalar(0.0f, DType::F32, d));
    lr.push_back(Tensor::scalar(0.0f, DType::F32, d));
    inv.push_back(Tensor::scalar(1.0f, DType::F32, d));
    coef.push_back(Tensor::scalar(1.0f, DType::F32, d));
  }
  std::vector<Tensor> found[2];
  for (float f : found_pattern) {
    found[0].push_back(Tensor::scalar(f));
    found[1].push_back(dev_scalar(f));
  }
  const AdamWHyper h;
  for (int dev = 0; dev < 2; ++dev) {
    const Backend& be = dev ? gpu() : cpu();
    const uint64_t reads_before = blocking_host_reads();
    for (const Tensor& f : found[dev]) {
      be.lookup(table[dev], count[dev], lr[dev]);
      be.adamw(h, {{&p[dev], &m[dev], &v[dev], &g[dev], nullptr, 0.01f}}, {&inv[dev], &coef[dev], &f, &lr[dev], &count[dev]});
      be.count_applied(count[dev], f);
    }
    CHECK(blocking_host_reads() == reads_before);
  }
  CHECK(count[1].item() == 5.0f);
  CHECK(lr[1].item() == schedule[2]);
  const Tolerance t = tolerance_for(DType::F32, DType::F32, 5 * 16);
  const std::vector<double> pc = as_double(p[0]);
  std::vector<double> mag(pc.size());
  for (size_t i = 0; i < pc.size(); ++i) mag[i] = std::fabs(pc[i]) + 5 * 3.2 * schedule[0];
  check_close(p[1].to_vector(), pc, {2.0 * t.rel, 2.0 * t.abs}, mag);
}

TEST_CASE("cuda read_async returns the scalars in order, computed by the work enqueued before it", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  // A sum of 2^24 ones: the value exists only once that kernel has run.
  Tensor ones = Tensor::full(Shape{int64_t{1} << 24}, 1.0f, DType::F32, Device::cuda());
  Tensor total = dev_scalar(-1.0f), a = dev_scalar(1.5f), b = dev_scalar(-INFINITY), c = dev_scalar(NAN);
  BusyWork busy;
  busy.enqueue(2);
  gpu().sum(ones, total);
  const uint64_t reads_before = blocking_host_reads();
  std::unique_ptr<HostReadback> r = gpu().read_async({&a, &total, &b, &c, &a});
  CHECK(blocking_host_reads() == reads_before);  // enqueued, not waited for
  const std::vector<float>& got = r->wait();
  REQUIRE(got.size() == 5);
  CHECK(got[0] == 1.5f);
  CHECK(got[1] == 16777216.0f);
  CHECK(got[2] == -INFINITY);
  CHECK(std::isnan(got[3]));
  CHECK(got[4] == 1.5f);
  CHECK(r->ready());
  CHECK(&r->wait() == &got);  // waiting again returns the same values

  // Nothing to read: an empty answer, ready once the queue has passed.
  std::unique_ptr<HostReadback> none = gpu().read_async({});
  CHECK(none->wait().empty());
  CHECK(none->ready());

  // The gather takes at most 16 scalars a call; more is a clear error, and so is a scalar
  // that is not an FP32 [1] on the GPU.
  std::vector<const Tensor*> many(17, &a);
  CHECK_THROWS_AS(gpu().read_async(many), Error);
  Tensor host = Tensor::scalar(1.0f);
  CHECK_THROWS_AS(gpu().read_async({&a, &host}), Error);
  Tensor pair = Tensor::zeros(Shape{2}, DType::F32, Device::cuda());
  CHECK_THROWS_AS(gpu().read_async({&pair}), Error);
  many.resize(16);
  const std::vector<float> sixteen = gpu().read_async(many)->wait();  // a copy: the readback dies here
  CHECK(sixteen == std::vector<float>(16, 1.5f));
}

TEST_CASE("cuda read_async is a snapshot: later kernels do not change what it returns", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  BusyWork busy;
  Tensor s = dev_scalar(3.0f);
  busy.enqueue(2);  // the gather and the fill below are both still queued when wait() is called
  std::unique_ptr<HostReadback> r = gpu().read_async({&s});
  gpu().fill(s, 7.0f);
  std::unique_ptr<HostReadback> r2 = gpu().read_async({&s});
  CHECK(r->wait() == std::vector<float>{3.0f});
  CHECK(r2->wait() == std::vector<float>{7.0f});
  CHECK(r->ready());
  CHECK(s.item() == 7.0f);
}

TEST_CASE("cuda read_async: many readbacks alive at once, slots reused after", "[gpu][step]") {
  BELAY_REQUIRE_GPU();
  BusyWork busy;
  std::vector<Tensor> s;
  for (int i = 0; i < 10; ++i) s.push_back(dev_scalar(static_cast<float>(i)));
  for (int round = 0; round < 3; ++round) {
    busy.enqueue(1);
    std::vector<std::unique_ptr<HostReadback>> rs;
    for (int i = 0; i < 10; ++i) {
      rs.push_back(gpu().read_async({&s[i], &s[(i + 1) % 10]}));
      gpu().fill(s[i], 100.0f * (round + 1) + i);  // after the snapshot: must not show
    }
    // Some readbacks are dropped unwaited: their slots go back only once written.
    rs[3].reset();
    rs[8].reset();
    for (int i = 9; i >= 0; --i) {
      if (!rs[i]) continue;
      INFO("round " << round << ", readback " << i);
      const float base = 100.0f * round;  // what the previous round filled in (round 0: the start)
      const float next = i == 9 ? 100.0f * (round + 1) : base + (i + 1);  // s[0] was refilled first
      CHECK(rs[i]->wait() == std::vector<float>{base + i, next});
      CHECK(rs[i]->ready());
    }
  }
}
