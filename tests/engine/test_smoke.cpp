#include <catch2/catch.hpp>

#include "engine/tensor.h"

TEST_CASE("a tensor holds what it was given", "[engine]") {
  auto t = belay::Tensor::from_vector({1, 2, 3}, belay::Shape{3});
  REQUIRE(t.to_vector() == std::vector<float>{1, 2, 3});
}
