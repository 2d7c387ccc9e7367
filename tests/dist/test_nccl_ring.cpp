// The emulated NCCL's all-reduce, reduce-scatter and all-gather, run by mpirun on N ranks (tests/dist/nccl_test.sh runs it on
// 3, where the order of a ring's sums shows): each rank's result must be, bit for bit, the
// ring's documented order (kernels/cuda/emulation/nccl.cpp: chunk c summed as
// ((x_c + x_{c+1}) + x_{c+2}) + ..., rounded to the dtype at every hop), and within the
// tolerance helper's bound of the FP64 sum: N-1 roundings of u each, on partial sums no
// larger than sum |x_i|, are inside tolerance_for(dtype, dtype, N) * sum |x_i|.
// The work is ordered on a stream as a GPU orders it: the inputs are copied in on the stream,
// the result copied out after the collective and waited for by polling an event.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/dtype.h"
#include "tests/tolerance.h"

namespace belay::test {
namespace {

struct Mpi {
  Mpi() { MPI_Init(nullptr, nullptr); }
  ~Mpi() { MPI_Finalize(); }
};
Mpi& mpi() {
  static Mpi m;
  return m;
}

// Rank r's element i: magnitudes spread over 2^-8 .. 2^8 and both signs, so that the order of
// the sums changes the rounded result.
float input(int r, size_t i) {
  uint64_t h = (static_cast<uint64_t>(r) + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  const double mant = 1.0 + static_cast<double>(h & 0xffff) / 65536.0;
  const int exp = static_cast<int>((h >> 16) % 17) - 8;
  return static_cast<float>(((h >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(mant, exp));
}

// The documented ring order for element i of a buffer of `count` elements.
float ring_sum(DType dtype, size_t count, size_t i, int n, size_t slot_elems, std::vector<char>& one) {
  const size_t slice = static_cast<size_t>(n) * slot_elems;
  const size_t first = i / slice * slice, len = std::min(slice, count - first), at = i - first;
  int c = 0;
  while (len * static_cast<size_t>(c + 1) / static_cast<size_t>(n) <= at) ++c;
  auto rounded = [&](float x) {
    store_from_f32(one.data(), dtype, 0, x);
    return load_as_f32(one.data(), dtype, 0);
  };
  float acc = rounded(input(c, i));
  for (int k = 1; k < n; ++k) acc = rounded(acc + rounded(input((c + k) % n, i)));
  return acc;
}

// The communicator of every rank (MPI carries the unique id), and the rank's place in it.
struct Ring {
  int rank = 0, n = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  Ring() {
    mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    ncclUniqueId id;
    if (rank == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    REQUIRE(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  }
  ~Ring() {
    ncclCommDestroy(comm);
    cudaStreamDestroy(stream);
  }
  // Copies `bytes` of device memory out after the work queued on the stream, polling an event.
  std::vector<char> read(const void* device, size_t bytes) {
    void* pinned = nullptr;
    REQUIRE(cudaMallocHost(&pinned, bytes) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    cudaEvent_t done;
    REQUIRE(cudaEventCreate(&done) == cudaSuccess);
    REQUIRE(cudaEventRecord(done, stream) == cudaSuccess);
    for (cudaError_t rc; (rc = cudaEventQuery(done)) != cudaSuccess;) {
      REQUIRE(rc == cudaErrorNotReady);
      (void)cudaGetLastError();
      ncclResult_t state;
      REQUIRE(ncclCommGetAsyncError(comm, &state) == ncclSuccess);
      REQUIRE(state == ncclSuccess);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    std::vector<char> out(static_cast<char*>(pinned), static_cast<char*>(pinned) + bytes);
    cudaEventDestroy(done);
    cudaFreeHost(pinned);
    return out;
  }
};

void check_all_reduce(DType dtype, ncclDataType_t nccl_type, size_t count, bool in_place) {
  Ring ring;
  const int n = ring.n;
  const size_t es = dtype_size(dtype);
  std::vector<char> host(count * es), one(4);
  for (size_t i = 0; i < count; ++i) store_from_f32(host.data(), dtype, i, input(ring.rank, i));
  void *send = nullptr, *recv = nullptr;
  REQUIRE(cudaMalloc(&recv, count * es) == cudaSuccess);
  send = recv;
  if (!in_place) REQUIRE(cudaMalloc(&send, count * es) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(send, host.data(), count * es, cudaMemcpyHostToDevice, ring.stream) == cudaSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(send, recv, count, nccl_type, ncclSum, ring.comm, ring.stream) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  // Polled, as belay waits: the peers' halves arrive while this host thread goes on.
  const std::vector<char> out = ring.read(recv, count * es);
  // The slot size of nccl.cpp (64 KiB): a buffer past n slots runs in slices.
  const size_t slot_elems = (size_t{64} << 10) / es;
  std::vector<float> got(count), expected_bits(count);
  std::vector<double> exact(count), magnitude(count);
  size_t differ = 0;
  for (size_t i = 0; i < count; ++i) {
    got[i] = load_as_f32(out.data(), dtype, i);
    expected_bits[i] = ring_sum(dtype, count, i, n, slot_elems, one);
    for (int r = 0; r < n; ++r) {
      store_from_f32(one.data(), dtype, 0, input(r, i));
      const double x = load_as_f32(one.data(), dtype, 0);
      exact[i] += x;
      magnitude[i] += std::fabs(x);
    }
    if (std::memcmp(&got[i], &expected_bits[i], 4) != 0) ++differ;
  }
  INFO("rank " << ring.rank << " of " << n << ", " << dtype_name(dtype) << ", " << count << " elements");
  check_close(got, exact, tolerance_for(dtype, dtype, n), magnitude);
  CHECK(differ == 0);  // the ring's order, bit for bit

  cudaFree(recv);
  if (!in_place) cudaFree(send);
}


float rounded_to(DType dtype, float x) {
  char one[4];
  store_from_f32(one, dtype, 0, x);
  return load_as_f32(one, dtype, 0);
}

// ncclReduceScatter: rank r's sendbuff is n blocks of `count` elements, input(r, i) at i; rank
// r receives block r summed in NCCL's order for it (block c from rank c+1 round the ring to
// rank c, rounded to the dtype at every hop), bit for bit, within the bound of the exact sum.
// In place, recvbuff is block r of sendbuff; either way sendbuff's other blocks are untouched.
void check_reduce_scatter(DType dtype, ncclDataType_t nccl_type, size_t count, bool in_place) {
  Ring ring;
  const int rank = ring.rank, n = ring.n;
  const size_t es = dtype_size(dtype), total = count * static_cast<size_t>(n);
  std::vector<char> host(total * es);
  for (size_t i = 0; i < total; ++i) store_from_f32(host.data(), dtype, i, input(rank, i));
  char* send = nullptr;
  char* recv = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send), total * es) == cudaSuccess);
  if (in_place)
    recv = send + static_cast<size_t>(rank) * count * es;
  else
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv), count * es) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(send, host.data(), total * es, cudaMemcpyHostToDevice, ring.stream) == cudaSuccess);
  REQUIRE(ncclReduceScatter(send, recv, count, nccl_type, ncclSum, ring.comm, ring.stream) == ncclSuccess);
  const std::vector<char> out = ring.read(recv, count * es);
  const std::vector<char> after = ring.read(send, total * es);

  std::vector<float> got(count);
  std::vector<double> exact(count), magnitude(count);
  size_t differ = 0, touched = 0;
  for (size_t k = 0; k < count; ++k) {
    const size_t i = static_cast<size_t>(rank) * count + k;
    float acc = rounded_to(dtype, input((rank + 1) % n, i));
    for (int h = 2; h <= n; ++h) acc = rounded_to(dtype, acc + rounded_to(dtype, input((rank + h) % n, i)));
    got[k] = load_as_f32(out.data(), dtype, k);
    if (std::memcmp(&got[k], &acc, 4) != 0) ++differ;
    for (int r = 0; r < n; ++r) {
      const double x = rounded_to(dtype, input(r, i));
      exact[k] += x;
      magnitude[k] += std::fabs(x);
    }
  }
  for (size_t b = 0; b < total * es; ++b) {
    const bool mine = in_place && b / (count * es) == static_cast<size_t>(rank);
    if (!mine && after[b] != host[b]) ++touched;
  }
  INFO("reduce-scatter, rank " << rank << " of " << n << ", " << dtype_name(dtype) << ", " << count
                               << " elements per rank, " << (in_place ? "in place" : "out of place"));
  check_close(got, exact, tolerance_for(dtype, dtype, n), magnitude);
  CHECK(differ == 0);   // NCCL's order for the block, bit for bit
  CHECK(touched == 0);  // the rest of sendbuff as it was
  cudaFree(send);
  if (!in_place) cudaFree(recv);
}

// ncclAllGather: rank r's `count` elements become block r of every rank's recvbuff, bit for
// bit; in place, sendbuff is block r of recvbuff.
void check_all_gather(DType dtype, ncclDataType_t nccl_type, size_t count, bool in_place) {
  Ring ring;
  const int rank = ring.rank, n = ring.n;
  const size_t es = dtype_size(dtype), total = count * static_cast<size_t>(n);
  std::vector<char> host(count * es), expected(total * es);
  for (size_t i = 0; i < count; ++i) store_from_f32(host.data(), dtype, i, input(rank, i));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) store_from_f32(expected.data(), dtype, r * count + i, input(r, i));
  char* recv = nullptr;
  char* send = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv), total * es) == cudaSuccess);
  // The blocks of other ranks start as garbage: the gather must overwrite all of them.
  std::vector<char> garbage(total * es, static_cast<char>(0x5a));
  REQUIRE(cudaMemcpyAsync(recv, garbage.data(), total * es, cudaMemcpyHostToDevice, ring.stream) == cudaSuccess);
  if (in_place)
    send = recv + static_cast<size_t>(rank) * count * es;
  else
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send), count * es) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(send, host.data(), count * es, cudaMemcpyHostToDevice, ring.stream) == cudaSuccess);
  REQUIRE(ncclAllGather(send, recv, count, nccl_type, ring.comm, ring.stream) == ncclSuccess);
  const std::vector<char> out = ring.read(recv, total * es);
  INFO("all-gather, rank " << rank << " of " << n << ", " << dtype_name(dtype) << ", " << count
                           << " elements per rank, " << (in_place ? "in place" : "out of place"));
  CHECK(std::memcmp(out.data(), expected.data(), total * es) == 0);
  cudaFree(recv);
  if (!in_place) cudaFree(send);
}

TEST_CASE("emulated ncclAllReduce sums in the dtype along the ring in order on the stream", "[nccl]") {
  check_all_reduce(DType::F32, ncclFloat32, 1000, true);
  check_all_reduce(DType::F16, ncclFloat16, 7, true);
  check_all_reduce(DType::BF16, ncclBfloat16, 1001, false);
  // Past 3 slots of 64 KiB: two slices, each its own ring (a cut inside the second).
  check_all_reduce(DType::F16, ncclFloat16, 3 * (size_t{32} << 10) + 12345, true);
}

// Every dtype, in place and not; 40000 FP32 elements per rank is past one 64 KiB slot (each
// block runs in slices, each a ring of its own); 1 element per rank, the smallest block.
TEST_CASE("emulated ncclReduceScatter sums each block in NCCL's ring order, in place or not", "[nccl]") {
  check_reduce_scatter(DType::F32, ncclFloat32, 1000, true);
  check_reduce_scatter(DType::F32, ncclFloat32, 40000, false);
  check_reduce_scatter(DType::F16, ncclFloat16, 7, false);
  check_reduce_scatter(DType::F16, ncclFloat16, 1, true);
  check_reduce_scatter(DType::BF16, ncclBfloat16, 1001, true);
  check_reduce_scatter(DType::BF16, ncclBfloat16, 40000, false);
}

TEST_CASE("emulated ncclAllGather gives every rank every block, in place or not", "[nccl]") {
  check_all_gather(DType::F32, ncclFloat32, 40000, true);
  check_all_gather(DType::F32, ncclFloat32, 3, false);
  check_all_gather(DType::F16, ncclFloat16, 1001, true);
  check_all_gather(DType::BF16, ncclBfloat16, 1, false);
  check_all_gather(DType::BF16, ncclBfloat16, 70000, true);
}

}  // namespace
}  // namespace belay::test
