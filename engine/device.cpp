#include "engine/device.h"

#include "engine/error.h"

namespace belay {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.rfind("cuda:", 0) == 0) {
    const std::string idx = name.substr(5);
    if (!idx.empty() && idx.size() < 4 && idx.find_first_not_of("0123456789") == std::string::npos)
      return Device::cuda(std::stoi(idx));
  }
  throw UsageError("unknown device '" + name + "': use cpu, cuda or cuda:N");
}

}  // namespace belay
