// The op table's argument checks run once for every backend (engine/backend_checks.cpp): every
// op with each kind of bad argument (tests/kernels/backend_checks_cases.h) is the same error,
// of the same type with the same message up to the devices named, on the CPU backend and on
// the CUDA one, before anything is launched.
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/backend_checks_cases.h"

using namespace belay;
using namespace belay::test;
using namespace belay::test::backend_checks;

TEST_CASE("cuda: every op's good call in the check table passes the checks", "[gpu][checks]") {
  BELAY_REQUIRE_GPU();
  for (const Op& op : ops()) {
    INFO(op.name);
    std::vector<Tensor> t = make_args(op.args, Device::cuda());
    CHECK_NOTHROW(op.call(gpu(), t));
  }
  gpu().synchronize();
}

TEST_CASE("cuda and cpu refuse every op's bad arguments with the same error", "[gpu][checks]") {
  BELAY_REQUIRE_GPU();
  size_t ran = 0;
  for (const BadCall& c : bad_calls()) {
    INFO(c.op << ": " << c.what);
    const Thrown on_cpu = thrown_by(c, cpu(), Device::cpu(), Device::cuda());
    const Thrown on_gpu = thrown_by(c, gpu(), Device::cuda(), Device::cpu());
    INFO("cpu: " << on_cpu.message);
    INFO("cuda: " << on_gpu.message);
    CHECK(on_gpu.is_error);
    CHECK(on_gpu.is_usage_error == on_cpu.is_usage_error);
    CHECK(holds(on_gpu.message, c.expect));
    CHECK(without_devices(on_gpu.message) == without_devices(on_cpu.message));
    ++ran;
  }
  CHECK(ran > 250);
  gpu().synchronize();  // nothing was launched by a refused call: the queue is as it was
}
