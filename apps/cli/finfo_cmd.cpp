// `belay finfo [VALUE...]`: the dtype table, and how each given value rounds in each dtype.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "apps/cli/finfo_cmd.h"
#include "engine/dtype.h"
#include "engine/error.h"

namespace belay {

int run_finfo(const std::vector<std::string>& values, std::ostream& out) {
  std::vector<float> parsed;
  for (const std::string& v : values) {
    char* end = nullptr;
    const float f = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0') throw UsageError("finfo: '" + v + "' is not a number");
    parsed.push_back(f);
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-6s %5s %15s %17s %20s %15s\n", "dtype", "bits", "max", "smallest_normal",
                "smallest_subnormal", "eps");
  out << buf;
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    const FInfo fi = finfo(d);
    std::snprintf(buf, sizeof buf, "%-6s %5d %15.8g %17.8g %20.8g %15.8g\n", dtype_name(d), fi.bits, (double)fi.max,
                  (double)fi.smallest_normal, (double)fi.smallest_subnormal, (double)fi.eps);
    out << buf;
  }
  for (size_t i = 0; i < parsed.size(); ++i) {
    out << "\n" << values[i] << " (as fp32: ";
    std::snprintf(buf, sizeof buf, "%.9g", (double)parsed[i]);
    out << buf << ")\n";
    for (DType d : {DType::F16, DType::BF16}) {
      const float r = round_to(d, parsed[i]);
      const uint16_t bits = d == DType::F16 ? f32_to_f16_bits(parsed[i]) : f32_to_bf16_bits(parsed[i]);
      const double rel = parsed[i] != 0.0f && std::isfinite(r) ? std::fabs((double)r - parsed[i]) / std::fabs((double)parsed[i]) : 0.0;
      const char* note = std::isinf(r) && !std::isinf(parsed[i]) ? "  overflow to inf"
                         : (r == 0.0f && parsed[i] != 0.0f) ? "  underflow to zero"
                         : (std::fabs(r) < finfo(d).smallest_normal && r != 0.0f) ? "  subnormal"
                                                                                     : "";
      std::snprintf(buf, sizeof buf, "  %-5s -> %-16.9g bits 0x%04x  rel. error %.3g%s\n", dtype_name(d), (double)r,
                    bits, rel, note);
      out << buf;
    }
  }
  return 0;
}

}  // namespace belay
