// The op table's argument checks on the CPU backend: every op with each kind of bad argument
// (tests/kernels/backend_checks_cases.h) is a belay::Error that names the op and what is
// wrong. tests/gpu/test_cuda_backend_checks.cpp holds the CUDA backend to the same errors.
#include <catch2/catch.hpp>

#include "tests/kernels/backend_checks_cases.h"

using namespace belay;
using namespace belay::test::backend_checks;

TEST_CASE("every op's good call in the check table passes the CPU backend's checks", "[kernels][checks]") {
  const Backend& be = backend_for(Device::cpu());
  for (const Op& op : ops()) {
    INFO(op.name);
    std::vector<Tensor> t = make_args(op.args, Device::cpu());
    CHECK_NOTHROW(op.call(be, t));
  }
}

TEST_CASE("the CPU backend refuses every op's bad arguments with an Error naming the op and the fault",
          "[kernels][checks]") {
  const Backend& be = backend_for(Device::cpu());
  // The device cases need a tensor of the other kind: a CUDA device (real or emulated).
  const bool two_kinds = cuda_device_count() > 0;
  size_t ran = 0;
  for (const BadCall& c : bad_calls()) {
    if (c.needs_two_kinds && !two_kinds) continue;
    INFO(c.op << ": " << c.what);
    const Thrown t = thrown_by(c, be, Device::cpu(), Device::cuda());
    INFO("message: " << t.message);
    CHECK(t.is_error);
    CHECK(t.message.rfind(c.op, 0) == 0);
    CHECK(holds(t.message, c.expect));
    ++ran;
  }
  CHECK(ran > 200);  // every op, several cases each
}
