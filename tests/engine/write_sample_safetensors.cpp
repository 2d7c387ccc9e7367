// Writes the sample file that tests/engine/safetensors_independent_check.py reads with
// Python's standard library alone: every dtype belay writes, known values, metadata.
// The values are exact in F16 and BF16, so the checker can compute the expected bytes.
#include <cstdio>
#include <limits>

#include "engine/error.h"
#include "engine/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_sample_safetensors OUT.safetensors\n");
    return 2;
  }
  using belay::DType;
  using belay::Shape;
  using belay::Tensor;
  const std::vector<float> values = {1.0f, -2.5f, 0.15625f, 1024.0f, -0.0f, 3.0f};
  try {
    belay::write_safetensors(
        argv[1],
        {{"weight", Tensor::from_vector(values, Shape{2, 3}, DType::F32)},
         {"weight_f16", Tensor::from_vector(values, Shape{3, 2}, DType::F16)},
         {"weight_bf16", Tensor::from_vector(values, Shape{6}, DType::BF16)},
         {"scalar", Tensor::from_vector({7.0f}, Shape{}, DType::F32)},
         {"empty", Tensor::empty(Shape{0, 4}, DType::F16)}},
        {{"belay.sample", "1"}, {"step", "42"}, {"note", "h\xc3\xa9llo \"quoted\"\n"}},
        {{"labels", {0, 1, -1, int64_t{1} << 40, std::numeric_limits<int64_t>::min()}}});
  } catch (const belay::Error& e) {
    std::fprintf(stderr, "write_sample_safetensors: %s\n", e.what());
    return 1;
  }
  return 0;
}
