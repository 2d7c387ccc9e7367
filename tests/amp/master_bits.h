// The bits of every FP32 master of a model, in parameter order: two runs that must agree
// exactly (ranks vs one process, buckets vs one all-reduce) compare these.
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/modules.h"
#include "tests/tolerance.h"

namespace belay::test {

inline std::vector<uint32_t> master_bits(const Module& m) {
  std::vector<uint32_t> out;
  for (const Var& p : m.parameters()) {
    const std::vector<uint32_t> b = bits_of(p.master());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

}  // namespace belay::test
