// GPU benchmarks of belay's CUDA backend, for bench/gpu-check.sh on a lent GPU. Prints one
// JSON object on stdout (progress on stderr). Every timed result is checked cheaply, so a
// fast wrong kernel cannot look good:
//   gemm:  belay's tensor-core GEMM (through the backend's op table) against cuBLAS
//          (cublasGemmEx, FP32 compute): the forward layout Y = X W^T at n^3 for n in
//          1024..8192, FP16 and BF16; at 4096 also the two backward layouts, dX = dY W and
//          dW = dY^T X (the latter into an FP32 C, as the weight gradient is kept). Check:
//          1024 sampled elements of both results against an FP64 dot product, bound
//          (2 u_in + K u32 + u_out) * sum |a b| (tests/tolerance.h's formula).
//   step:  the fused guard + clip coefficient + AdamW + scaler update on a model-sized set of
//          FP32 gradients with FP16 working copies, against the device-to-device copy
//          bandwidth (cudaMemcpy of a 2 GiB buffer). Check: the guard's norm
//          against an FP64 sum over a sample tensor, found_inf == 0, masters moved.
//   sync:  what lets a step run without a host wait: lookup + count_applied (GPU time, one
//          thread each, so the cost is the launch), read_async and a 1 MiB upload (host time
//          per call, enqueued behind ~ms of queued GEMM work). Checks: the uploads and
//          read_asyncs returned while that work was still queued (no host wait), and the
//          values that then land are the right ones.
//   attention: the fused attention (Backend::attention + attention_backward) at GPT-2's
//          shape, B 4, H 12, T 1024, d 64, causal, FP16 and BF16: milliseconds forward and
//          forward + backward, beside the time at the tensor cores' peak (989 TFLOP/s dense:
//          4 B H T^2 d / 2 flops forward, 2.5 times that backward; a bound, not a measurement).
//          PyTorch's SDPA on the same shape: bench/gpu/torch_sdpa.py. Check: 4 rows of out
//          against an FP64 softmax(q k^T) v of the same inputs.
// cuBLAS lives only here and in tests, never on the training path.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/census.h"
#include "engine/tensor.h"
#include "kernels/cuda/gemm_kernels.h"

using namespace belay;

namespace {

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_CUBLAS(x)                                                        \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      std::fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// Deterministic values in [-1, 1) written straight into 16-bit storage on the device.
__global__ void fill_hash_kernel(uint16_t* p, int64_t n, uint32_t seed, bool bf16) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (h & 0xffffff) / 8388608.0f - 1.0f;
    p[i] = bf16 ? f32_to_bf16_bits(v) : f32_to_f16_bits(v);
  }
}

template <class F>
double time_ms(F&& f, int iters) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

float to_f32(uint16_t h, bool bf16) { return bf16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h); }

// One product of a linear layer, all operands n x n: C = op(A) op(B).
struct GemmLayout {
  const char* name;
  bool trans_a, trans_b;
  bool c_f32;  // C in FP32 (the weight gradient), else in the inputs' dtype
};
const GemmLayout kForward{"Y=XW^T", false, true, false};
const GemmLayout kBackwardData{"dX=dYW", false, false, false};
const GemmLayout kBackwardWeight{"dW=dY^TX", true, false, true};

std::string gemm_bench(int64_t n, DType dtype, const GemmLayout& layout, cublasHandle_t handle) {
  const bool bf16 = dtype == DType::BF16;
  const Device dev = Device::cuda();
  const DType c_dtype = layout.c_f32 ? DType::F32 : dtype;
  Tensor a = Tensor::empty(Shape{n, n}, dtype, dev), b = Tensor::empty(Shape{n, n}, dtype, dev);
  Tensor c = Tensor::empty(Shape{n, n}, c_dtype, dev), cref = Tensor::empty(Shape{n, n}, c_dtype, dev);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(a.data()), n * n, 17u, bf16);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(b.data()), n * n, 91u, bf16);
  const Backend& be = backend_for(dev);
  GemmArgs args{&a, layout.trans_a, &b, layout.trans_b, &c, 0.0f, nullptr};
  auto ours = [&] { be.gemm(args); };
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and cuBLAS sees each
  // row-major operand as its transpose: an operand that is not transposed here is passed
  // as CUBLAS_OP_N, a transposed one as CUBLAS_OP_T (all leading dimensions n).
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType tc = layout.c_f32 ? CUDA_R_32F : t;
  const cublasOperation_t op_b = layout.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = layout.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto theirs = [&] {
    CHECK_CUBLAS(cublasGemmEx(handle, op_b, op_a, (int)n, (int)n, (int)n, &one, b.data(), t, (int)n, a.data(), t,
                              (int)n, &zero, cref.data(), tc, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  ours();
  theirs();
  CHECK_CUDA(cudaDeviceSynchronize());
  const int iters = n >= 8192 ? 10 : n >= 4096 ? 30 : 100;
  const double ms_ours = time_ms(ours, iters), ms_theirs = time_ms(theirs, iters);

  // The check: sampled elements against FP64.
  std::vector<uint16_t> ah(n * n), bh(n * n);
  CHECK_CUDA(cudaMemcpy(ah.data(), a.data(), n * n * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(bh.data(), b.data(), n * n * 2, cudaMemcpyDeviceToHost));
  const std::vector<float> ch = c.to_vector(), rh = cref.to_vector();
  auto op_a_at = [&](int64_t i, int64_t k) { return to_f32(layout.trans_a ? ah[k * n + i] : ah[i * n + k], bf16); };
  auto op_b_at = [&](int64_t k, int64_t j) { return to_f32(layout.trans_b ? bh[j * n + k] : bh[k * n + j], bf16); };
  const double u_in = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  const double u_out = layout.c_f32 ? u32 : u_in;
  std::mt19937_64 rng(5);
  double worst_ours = 0, worst_theirs = 0;
  for (int s = 0; s < 1024; ++s) {
    const int64_t i = rng() % n, j = rng() % n;
    double exact = 0, mag = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double p = (double)op_a_at(i, k) * op_b_at(k, j);
      exact += p;
      mag += std::fabs(p);
    }
    const double bound = (2 * u_in + n * u32 + u_out) * mag + 1e-30;
    worst_ours = std::fmax(worst_ours, std::fabs(ch[i * n + j] - exact) / bound);
    worst_theirs = std::fmax(worst_theirs, std::fabs(rh[i * n + j] - exact) / bound);
  }
  const double flops = 2.0 * n * n * n;
  const double tf_ours = flops / (ms_ours * 1e-3) / 1e12, tf_theirs = flops / (ms_theirs * 1e-3) / 1e12;
  std::fprintf(stderr, "gemm %s %s %lld: belay %.3f ms (%.1f TFLOP/s), cuBLAS %.3f ms (%.1f TFLOP/s), ratio %.3f, "
               "error/bound belay %.3f cuBLAS %.3f\n", layout.name, dtype_name(dtype), (long long)n, ms_ours, tf_ours,
               ms_theirs, tf_theirs, tf_ours / tf_theirs, worst_ours, worst_theirs);
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "{\"layout\": \"%s\", \"dtype\": \"%s\", \"n\": %lld, \"belay_ms\": %.4f, \"belay_tflops\": %.2f, "
                "\"cublas_ms\": %.4f, \"cublas_tflops\": %.2f, \"ratio\": %.4f, \"error_over_bound_belay\": %.4f, "
                "\"error_over_bound_cublas\": %.4f, \"correct\": %s}",
                layout.name, dtype_name(dtype), (long long)n, ms_ours, tf_ours, ms_theirs, tf_theirs,
                tf_ours / tf_theirs, worst_ours, worst_theirs, worst_ours <= 1.0 ? "true" : "false");
  return buf;
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t{2} << 30;
  void *a, *b;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  auto copy = [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); };
  copy();
  const double ms = time_ms(copy, 20);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;  // read + write
}

// The tensor sizes shared with bench/gpu/torch_amp_step.py: 64 matrices of 2048 x 2048 and
// 64 vectors of 2048 (~269 M parameters), plus 3 odd ones.
std::vector<int64_t> step_sizes() {
  std::vector<int64_t> s;
  for (int i = 0; i < 64; ++i) {
    s.push_back(2048 * 2048);
    s.push_back(2048);
  }
  s.push_back(1);
  s.push_back(129);
  s.push_back(1000);
  return s;
}

// The guard's norm of one (the 129-element) tensor against an FP64 sum on the host.
bool guard_norm_right(const Tensor& probe, const Tensor& inv) {
  const Backend& be = backend_for(probe.device());
  Tensor found = Tensor::scalar(0.0f, DType::F32, probe.device()), norm = Tensor::scalar(0.0f, DType::F32, probe.device());
  be.guard({&probe}, inv, found, norm);
  double want = 0;
  for (float g : probe.to_vector()) want += (double)(g / 65536.0f) * (g / 65536.0f);
  want = std::sqrt(want);
  return std::fabs(norm.item() - want) <= 1e-5 * want + 1e-30;
}

std::string step_bench() {
  const Device dev = Device::cuda();
  const Backend& be = backend_for(dev);
  std::vector<Tensor> master, m, v, grad, working;
  int64_t total = 0;
  uint32_t seed = 1;
  for (int64_t n : step_sizes()) {
    master.push_back(Tensor::full(Shape{n}, 0.5f, DType::F32, dev));
    m.push_back(Tensor::zeros(Shape{n}, DType::F32, dev));
    v.push_back(Tensor::zeros(Shape{n}, DType::F32, dev));
    working.push_back(Tensor::empty(Shape{n}, DType::F16, dev));
    // FP32 gradients scaled by 2^16, as after a scaled backward: fill through a 16-bit
    // temporary (values in [-1, 1)), cast, scale.
    Tensor tmp = Tensor::empty(Shape{n}, DType::F16, dev);
    fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(tmp.data()), n, seed++, false);
    Tensor g = tmp.to(DType::F32);
    be.scale(g, 65536.0f, g);
    grad.push_back(g);
    total += n;
  }
  std::vector<const Tensor*> gptrs;
  std::vector<AdamWSlot> slots;
  for (size_t i = 0; i < grad.size(); ++i) {
    gptrs.push_back(&grad[i]);
    slots.push_back({&master[i], &m[i], &v[i], &grad[i], &working[i], 0.01f});
  }
  Tensor scale = Tensor::scalar(65536.0f, DType::F32, dev), inv = Tensor::scalar(1.0f / 65536.0f, DType::F32, dev);
  Tensor found = Tensor::scalar(0.0f, DType::F32, dev), norm = Tensor::scalar(0.0f, DType::F32, dev);
  Tensor coef = Tensor::scalar(0.0f, DType::F32, dev);
  Tensor tracker = Tensor::scalar(0.0f, DType::F32, dev), hyst = Tensor::scalar(1.0f, DType::F32, dev);
  // lr and the applied-step count are device scalars, as in a real step (the bias
  // corrections are computed on the device from the count: t = 1 here).
  Tensor lr = Tensor::scalar(1e-3f, DType::F32, dev), applied = Tensor::scalar(0.0f, DType::F32, dev);
  const AdamWHyper h;
  const StepScalars scalars{&inv, &coef, &found, &lr, &applied};
  ScalerConfig sc;
  auto guard = [&] { be.guard(gptrs, inv, found, norm); };
  auto step = [&] {
    be.guard(gptrs, inv, found, norm);
    be.clip_coefficient(norm, 1.0f, coef);
    be.adamw(h, slots, scalars);
    be.scaler_update(sc, scale, tracker, hyst, found);
  };
  step();
  CHECK_CUDA(cudaDeviceSynchronize());
  // Checks: nothing non-finite, the norm of the 129-element tensor right, and
  // the masters moved (the step was not skipped).
  const bool finite = found.item() == 0.0f;
  const bool norm_ok = guard_norm_right(grad[grad.size() - 2], inv);
  const bool moved = master[0].to_vector()[0] != 0.5f;
  // Scale 2^16 stays put (no growth for 2000 steps) so every timed step is a real update.
  scale.fill(65536.0f);
  const double ms_guard = time_ms(guard, 20);
  // The guard with the numerics census (engine/census.h) in its one read: the issue's aim is
  // at most 1.10x the plain guard's time.
  Tensor census = Tensor::empty(Shape{static_cast<int64_t>(gptrs.size()), kCensusFields}, DType::F32, dev);
  const double ms_guard_census = time_ms([&] { be.guard(gptrs, inv, found, norm, GuardCensus{&census, DType::F16}); }, 20);
  const double ms_step = time_ms(step, 20);
  const double copy_gbs = copy_bandwidth_gbs();
  // Bytes: guard reads grad (4); AdamW reads grad, master, m, v (16), writes master, m, v (12)
  // and the FP16 working copy (2).
  const double guard_bytes = 4.0 * total, step_bytes = (4.0 + 16.0 + 12.0 + 2.0) * total;
  const double guard_gbs = guard_bytes / (ms_guard * 1e-3) / 1e9, step_gbs = step_bytes / (ms_step * 1e-3) / 1e9;
  std::fprintf(stderr, "step: %lld params, guard %.3f ms (%.0f GB/s), with the census %.3f ms (%.3fx), "
               "guard+clip+adamw+scaler %.3f ms (%.0f GB/s), copy %.0f GB/s, ratio %.3f, checks finite=%d norm=%d "
               "moved=%d\n", (long long)total, ms_guard, guard_gbs, ms_guard_census, ms_guard_census / ms_guard, ms_step,
               step_gbs, copy_gbs, step_gbs / copy_gbs, finite, norm_ok, moved);
  char buf[896];
  std::snprintf(buf, sizeof buf,
                "{\"params\": %lld, \"tensors\": %zu, \"guard_ms\": %.4f, \"guard_gbs\": %.1f, "
                "\"guard_census_ms\": %.4f, \"census_over_guard\": %.4f, \"step_ms\": %.4f, "
                "\"step_gbs\": %.1f, \"step_bytes_per_param\": 34, \"copy_gbs\": %.1f, \"step_over_copy\": %.4f, "
                "\"correct\": %s}",
                (long long)total, grad.size(), ms_guard, guard_gbs, ms_guard_census, ms_guard_census / ms_guard, ms_step,
                step_gbs, copy_gbs, step_gbs / copy_gbs, finite && norm_ok && moved ? "true" : "false");
  return buf;
}

double host_us(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b, int calls) {
  return std::chrono::duration<double, std::micro>(b - a).count() / calls;
}

std::string sync_bench() {
  const Device dev = Device::cuda();
  const Backend& be = backend_for(dev);
  std::vector<float> schedule(1000);
  for (size_t i = 0; i < schedule.size(); ++i) schedule[i] = 1e-3f / (1.0f + i);
  Tensor table = Tensor::from_vector(schedule, Shape{1000}, DType::F32, dev);
  Tensor count = Tensor::scalar(0.0f, DType::F32, dev), lr = Tensor::scalar(0.0f, DType::F32, dev);
  Tensor found = Tensor::scalar(0.0f, DType::F32, dev);
  const int iters = 200;
  const double ms_pair = time_ms([&] {
    be.lookup(table, count, lr);
    be.count_applied(count, found);
  }, iters);
  const bool count_ok = count.item() == static_cast<float>(iters) && lr.item() == schedule[iters - 1];

  // Queue ~ms of work (FP32 GEMMs), then upload and read back behind it: every call must
  // return while the queue has not drained.
  const int64_t n = 4096;
  Tensor a = Tensor::full(Shape{n, n}, 0.5f, DType::F32, dev), b = Tensor::full(Shape{n, n}, 0.25f, DType::F32, dev);
  Tensor c = Tensor::empty(Shape{n, n}, DType::F32, dev);
  GemmArgs g{&a, false, &b, false, &c, 0.0f, nullptr};
  const size_t bytes = size_t{1} << 20;
  const int uploads = 8;  // within the staging ring: none waits for an earlier one
  std::vector<std::vector<uint8_t>> src(uploads, std::vector<uint8_t>(bytes));
  for (int u = 0; u < uploads; ++u)
    for (size_t i = 0; i < bytes; ++i) src[u][i] = static_cast<uint8_t>(i * 31 + u);
  Tensor dst = Tensor::empty(Shape{uploads, static_cast<int64_t>(bytes / 4)}, DType::F32, dev);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t drained;
  CHECK_CUDA(cudaEventCreateWithFlags(&drained, cudaEventDisableTiming));
  const std::vector<float> want{(float)iters, lr.item(), 0.0f};
  double us_upload = 0, us_read = 0;
  bool no_wait = false, values_ok = true;
  // Round 0 grows the pinned pools (staging ring, readback slots); round 1, steady state, is
  // the one measured.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) be.gemm(g);
    const auto t0 = std::chrono::steady_clock::now();
    for (int u = 0; u < uploads; ++u)
      be.copy_bytes(static_cast<char*>(dst.data()) + u * bytes, dev, src[u].data(), Device::cpu(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<std::unique_ptr<HostReadback>> reads;
    for (int r = 0; r < 10; ++r) reads.push_back(be.read_async({&count, &lr, &found}));
    const auto t2 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaEventRecord(drained));
    no_wait = cudaEventQuery(drained) == cudaErrorNotReady && !reads.back()->ready();
    for (auto& r : reads) values_ok = r->wait() == want && values_ok;
    std::vector<uint8_t> back(bytes);
    for (int u = 0; u < uploads; ++u) {
      CHECK_CUDA(cudaMemcpy(back.data(), static_cast<char*>(dst.data()) + u * bytes, bytes, cudaMemcpyDeviceToHost));
      values_ok = values_ok && back == src[u];
    }
    us_upload = host_us(t0, t1, uploads);
    us_read = host_us(t1, t2, 10);
  }
  cudaEventDestroy(drained);
  std::fprintf(stderr, "sync: lookup+count_applied %.2f us (GPU), upload 1 MiB %.1f us (host), read_async %.1f us "
               "(host), returned before the queue drained=%d, checks count=%d values=%d\n", ms_pair * 1e3, us_upload,
               us_read, no_wait, count_ok, values_ok);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"lookup_count_applied_us\": %.3f, \"upload_1mib_host_us\": %.2f, \"read_async_host_us\": %.2f, "
                "\"returned_before_queue_drained\": %s, \"correct\": %s}",
                ms_pair * 1e3, us_upload, us_read, no_wait ? "true" : "false",
                count_ok && values_ok ? "true" : "false");
  return buf;
}

}  // namespace

// Forward and forward + backward of the fused attention, causal, one dtype.
std::string attention_bench(DType dtype) {
  const bool bf16 = dtype == DType::BF16;
  const Device dev = Device::cuda();
  const int64_t b = 4, h = 12, t = 1024, d = 64, n = b * h * t * d;
  const Shape shape{b, h, t, d};
  const float scale = 0.125f;
  Tensor q = Tensor::empty(shape, dtype, dev), k = Tensor::empty(shape, dtype, dev), v = Tensor::empty(shape, dtype, dev);
  Tensor g = Tensor::empty(shape, dtype, dev), out = Tensor::empty(shape, dtype, dev);
  Tensor lse = Tensor::empty(Shape{b, h, t}, DType::F32, dev);
  Tensor dq = Tensor::empty(shape, dtype, dev), dk = Tensor::empty(shape, dtype, dev), dv = Tensor::empty(shape, dtype, dev);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(q.data()), n, 5u, bf16);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(k.data()), n, 6u, bf16);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(v.data()), n, 7u, bf16);
  fill_hash_kernel<<<4096, 256>>>(static_cast<uint16_t*>(g.data()), n, 8u, bf16);
  const Backend& be = backend_for(dev);
  auto fwd = [&] { be.attention(q, k, v, true, scale, out, lse); };
  auto both = [&] {
    fwd();
    be.attention_backward(q, k, v, out, lse, g, true, scale, dq, dk, dv);
  };
  // Warm-up of about 50 ms (the SM clock idles at a few hundred MHz and takes that long to
  // rise: the first run measured fp16, timed first, 1.5x slower than bf16 with one warm-up).
  for (int i = 0; i < 20; ++i) both();
  CHECK_CUDA(cudaDeviceSynchronize());
  const double ms_fwd = time_ms(fwd, 100), ms_both = time_ms(both, 30);
  // Check: rows 0, 1, 511, 1023 of the first item against FP64 (bound: a few units of the dtype
  // per unit of sum p |v|, P being rounded to the dtype; |v| < 1 so that sum is <= 1).
  std::vector<uint16_t> hq(t * d), hk(t * d), hv(t * d), ho(t * d);
  CHECK_CUDA(cudaMemcpy(hq.data(), q.data(), t * d * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hk.data(), k.data(), t * d * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hv.data(), v.data(), t * d * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ho.data(), out.data(), t * d * 2, cudaMemcpyDeviceToHost));
  double worst = 0.0;
  for (int64_t i : {0, 1, 511, 1023}) {
    std::vector<double> p(i + 1);
    double mx = -1e300, l = 0.0;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int64_t c = 0; c < d; ++c) s += double(to_f32(hq[i * d + c], bf16)) * to_f32(hk[j * d + c], bf16);
      p[j] = s * scale;
      mx = std::max(mx, p[j]);
    }
    for (double& x : p) l += (x = std::exp(x - mx));
    for (int64_t c = 0; c < d; ++c) {
      double o = 0.0;
      for (int64_t j = 0; j <= i; ++j) o += p[j] / l * to_f32(hv[j * d + c], bf16);
      worst = std::max(worst, std::fabs(o - to_f32(ho[i * d + c], bf16)));
    }
  }
  const double u = bf16 ? 1.0 / 256 : 1.0 / 2048;
  const bool ok = worst <= 4 * u;
  const double flops_fwd = 4.0 * b * h * t * t * d / 2, flops_both = 3.5 * flops_fwd;
  const double bound_fwd = flops_fwd / 989e12 * 1e3, bound_both = flops_both / 989e12 * 1e3;
  std::fprintf(stderr, "attention %s B4 H12 T1024 d64 causal: forward %.3f ms (%.1f TFLOP/s), fwd+bwd %.3f ms (%.1f "
               "TFLOP/s); at the tensor-core peak %.3f / %.3f ms; check %s (worst %.2g)\n",
               bf16 ? "bf16" : "fp16", ms_fwd, flops_fwd / ms_fwd / 1e9, ms_both, flops_both / ms_both / 1e9, bound_fwd,
               bound_both, ok ? "ok" : "FAILED", worst);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"dtype\": \"%s\", \"shape\": \"B4 H12 T1024 d64 causal\", \"forward_ms\": %.4f, "
                "\"forward_backward_ms\": %.4f, \"forward_tflops\": %.1f, \"forward_backward_tflops\": %.1f, "
                "\"bound_at_tensor_peak_forward_ms\": %.4f, \"bound_at_tensor_peak_forward_backward_ms\": %.4f, "
                "\"check\": \"%s\"}",
                bf16 ? "bf16" : "fp16", ms_fwd, ms_both, flops_fwd / ms_fwd / 1e9, flops_both / ms_both / 1e9, bound_fwd,
                bound_both, ok ? "ok" : "FAILED");
  return buf;
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::puts("{\"error\": \"no CUDA device\"}");
    return 77;
  }
  // --quick: small sizes only. --section gemm|step|sync|attention (repeatable; default: all):
  // gpu-check.sh runs each section in its own process, so a kernel that takes the CUDA
  // context down costs its own section only.
  bool quick = false, gemm = false, step = false, sync = false, attention = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string section = a == "--section" && i + 1 < argc ? argv[++i] : "";
    if (a == "--quick") quick = true;
    else if (section == "gemm") gemm = true;
    else if (section == "step") step = true;
    else if (section == "sync") sync = true;
    else if (section == "attention") attention = true;
    else {
      std::fprintf(stderr, "gpu_bench: unknown option '%s' (use --quick, --section gemm|step|sync|attention)\n", argv[i]);
      return 2;
    }
  }
  if (!gemm && !step && !sync && !attention) gemm = step = sync = attention = true;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::string out = std::string("{\"device\": \"") + prop.name + "\"";
  if (gemm) {
    cublasHandle_t handle;
    CHECK_CUBLAS(cublasCreate(&handle));
    // The tensor-core GEMM's build options (gemm_layout.h), so that a variant's numbers say
    // what they measured.
    char config[160];
    std::snprintf(config, sizeof config, "%dx%dx%d, %d stages, warps %dx%d of %dx%d, group %d, %d KiB smem", gemm::kBM,
                  gemm::kBN, gemm::kBK, gemm::kStages, gemm::kWarpsM, gemm::kWarpsN, gemm::kWarpM, gemm::kWarpN,
                  gemm::kGroupM, gemm::kSmemBytes / 1024);
    out += ", \"gemm_warps\": \"" + std::to_string(gemm::kWarpsM) + "x" + std::to_string(gemm::kWarpsN) +
           "\", \"gemm_config\": \"" + config + "\", \"gemm_blocks_per_sm\": " +
           std::to_string(gemm_tensor_core_blocks_per_sm()) + ", \"gemm\": [";
    bool first = true;
    for (DType d : {DType::F16, DType::BF16}) {
      for (int64_t n : {1024, 2048, 4096, 8192}) {
        if (quick && n > 2048) continue;
        out += (first ? "" : ", ") + gemm_bench(n, d, kForward, handle);
        first = false;
      }
      const int64_t n_backward = quick ? 1024 : 4096;
      for (const GemmLayout* layout : {&kBackwardData, &kBackwardWeight})
        out += ", " + gemm_bench(n_backward, d, *layout, handle);
    }
    out += "]";
    cublasDestroy(handle);
  }
  if (step) out += ", \"step\": " + step_bench();
  if (sync) out += ", \"sync\": " + sync_bench();
  if (attention) out += ", \"attention\": [" + attention_bench(DType::F16) + ", " + attention_bench(DType::BF16) + "]";
  out += "}";
  std::puts(out.c_str());
  return 0;
}
