#include "amp/autocast.h"

namespace belay {

AutocastPolicy& autocast_policy() {
  thread_local AutocastPolicy policy;
  return policy;
}

Autocast::Autocast(DType dtype, bool enabled) : saved_(autocast_policy()) {
  autocast_policy() = {enabled && dtype != DType::F32, dtype};
}
Autocast::~Autocast() { autocast_policy() = saved_; }

AutocastOff::AutocastOff() : saved_(autocast_policy()) { autocast_policy().enabled = false; }
AutocastOff::~AutocastOff() { autocast_policy() = saved_; }

}  // namespace belay
