// The grid of the kernels that give each row a block of its own (softmax, LayerNorm,
// embedding): how many blocks a launch over `rows` rows asks for. Plain C++, no CUDA header,
// so that tests/kernels/test_cuda_index_math.cpp checks it on the CPU.
#pragma once
#include <cstdint>

namespace belay::cuda {

// Those kernels step over rows by gridDim.x (row r, then r + gridDim.x, ...), so any grid of
// at least one block covers every row once. A cap keeps a tall input's launch as small as
// CUDA's narrowest grid limit (gridDim.y and .z: 65535) and still fills any GPU many times over.
constexpr int64_t kMaxRowBlocks = 65535;

// One block per row, at most kMaxRowBlocks. rows must be positive (the launchers return
// before a launch over no rows).
constexpr unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
}

}  // namespace belay::cuda
