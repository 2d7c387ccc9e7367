// belay_bench_report: merges the parts of one benchmark run into one JSON document, works
// out the target ratios and prints the results as markdown tables (readable in a terminal,
// pastable into README.md).
//   belay_bench_report --out FILE [--machine TEXT] [--command TEXT] PART.json...
// A part with "state_bytes" is a belay_bench_memory result; any other is belay_bench's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

using Json = nlohmann::ordered_json;

namespace {

double num(const Json& j) { return j.is_number() ? j.get<double>() : NAN; }

void print_header(const std::vector<std::string>& cols) {
  std::string line = "|", rule = "|";
  for (const auto& c : cols) {
    line += " " + c + " |";
    rule += "---|";
  }
  std::printf("%s\n%s\n", line.c_str(), rule.c_str());
}

void print_row(const std::vector<std::string>& cells) {
  std::string line = "|";
  for (const auto& c : cells) line += " " + c + " |";
  std::printf("%s\n", line.c_str());
}

std::string fmt(double v, int decimals = 1) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string pm(const Json& time) {  // "12.3 ms ±4%"
  return fmt(num(time["median_ms"]), num(time["median_ms"]) < 10 ? 2 : 1) + " ±" + fmt(100 * num(time["iqr_rel"]), 0) + "%";
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path, machine, command;
  std::vector<std::string> parts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--machine" && i + 1 < argc) machine = argv[++i];
    else if (a == "--command" && i + 1 < argc) command = argv[++i];
    else parts.push_back(a);
  }
  Json doc{{"machine", machine}, {"command", command}};
  Json memory = Json::array();
  for (const std::string& p : parts) {
    std::ifstream in(p);
    if (!in) {
      std::cerr << "belay_bench_report: cannot read " << p << "\n";
      return 2;
    }
    Json j = Json::parse(in);
    if (j.contains("state_bytes")) memory.push_back(j);
    else
      for (auto& [k, v] : j.items()) doc[k] = v;
  }
  if (!memory.empty()) doc["memory"] = memory;

  Json targets = Json::array();
  auto target = [&](const std::string& name, double value, const std::string& op, double bound) {
    // Bytes per parameter carry a few bytes of one-element scalars: compare at 1e-3.
    const double slack = 1e-3 * std::fmax(1.0, std::fabs(bound));
    // "<" and ">" are strict (faster than, slower than): no slack.
    const bool met = op == ">=" ? value >= bound - slack
                     : op == "<=" ? value <= bound + slack
                     : op == ">"  ? value > bound
                     : op == "<"  ? value < bound
                                  : std::fabs(value) <= bound;
    targets.push_back({{"target", name}, {"value", value}, {"op", op}, {"bound", bound}, {"met", met}});
  };

  std::printf("Machine: %s\n\n", machine.c_str());
  if (doc.value("clock", "wall") == "thread_cpu")
    std::printf("Times are one thread's CPU time (--cpu-time), not wall time.\n\n");
  if (doc.contains("stream")) {
    const Json& s = doc["stream"];
    std::printf("### Memory bandwidth (%d threads, %.0f MiB arrays)\n\n", s["threads"].get<int>(),
                num(s["copy"]["array_bytes"]) / 1048576.0);
    print_header({"kernel", "GB/s (median)", "GB/s (best)", "time", });
    // copy_nt: non-temporal stores, no read-for-ownership of the destination; read: a sum,
    // reads only (older runs lack them).
    for (const char* k : {"copy", "copy_nt", "triad", "read"})
      if (s.contains(k))
        print_row({k, fmt(num(s[k]["gb_per_s"])), fmt(num(s[k]["gb_per_s_best"])), pm(s[k]["time"])});
    std::printf("\n");
  }
  if (doc.contains("amp")) {
    const Json& a = doc["amp"];
    const double copy = num(a["copy_gb_per_s_same_section"]);
    std::printf("### AMP step, optimizer half (FP32 master/m/v/grad, FP16 working copy; copy bandwidth %.1f GB/s, "
                "the better of the plain and the non-temporal copy)\n\n",
                copy);
    print_header({"params", "path", "ms (median ±IQR)", "bytes/param", "GB/s", "of copy BW", "unfused/fused"});
    for (const Json& r : a["sizes"]) {
      for (const char* k : {"fused", "unfused", "adamw"}) {
        const Json& v = r[k];
        print_row({std::to_string(r["params"].get<int64_t>() >> 20) + "M", k, pm(v["time"]),
                   fmt(num(v["bytes_per_param"]), 0), fmt(num(v["gb_per_s"])), fmt(num(v["fraction_of_copy"]), 2),
                   std::string(k) == "unfused" ? fmt(num(r["unfused_over_fused"]), 2) + " (bytes bound " +
                                                     fmt(num(r["unfused_over_fused_bytes_bound"]), 2) + ")"
                                               : ""});
      }
    }
    const Json& big = a["sizes"].back();
    target("fused AMP step at " + std::to_string(big["params"].get<int64_t>() >> 20) + "M params, fraction of copy bandwidth",
           num(big["fused"]["fraction_of_copy"]), ">=", 0.7);
    target("unfused / fused AMP step time at " + std::to_string(big["params"].get<int64_t>() >> 20) + "M params",
           num(big["unfused_over_fused"]), ">=", 2.0);
    std::printf("\n");
  }
  if (doc.contains("gemm")) {
    std::printf("### GEMM, Linear(n -> n) products at batch 256, GFLOP/s (median)\n\n");
    print_header({"n", "product", "Eigen direct fp32", "belay fp32", "belay bf16", "belay fp16", "belay fp32 / Eigen"});
    double worst = INFINITY;
    for (const Json& r : doc["gemm"]["sizes"])
      for (const char* op : {"forward", "dX", "dW"}) {
        const double ratio = num(r["belay_fp32_over_eigen"][op]);
        worst = std::fmin(worst, ratio);
        print_row({std::to_string(r["n"].get<int64_t>()), op, fmt(num(r["eigen_fp32"][op]["gflops"])),
                   fmt(num(r["belay_fp32"][op]["gflops"])), fmt(num(r["belay_bf16"][op]["gflops"])),
                   fmt(num(r["belay_fp16"][op]["gflops"])), fmt(ratio, 2)});
      }
    target("belay fp32 matmul / Eigen direct (worst product and size)", worst, ">=", 0.9);
    std::printf("\n");
  }
  if (doc.contains("isa")) {
    const Json& is = doc["isa"];
    std::printf("### CPU ISA paths: FMA peak, fp32 and bf16 GEMM, Linear(%lld) products at batch %lld, %d threads "
                "(in use: %s)\n\n"
                "bf16: both operands BF16, FP32 out; its limit is the FMA peak, or the VDPBF16PS peak on "
                "avx512bf16, or the TDPBF16PS peak on amx (the GEMM of every other path widens BF16 to FP32 "
                "while packing)\n\n",
                static_cast<long long>(is["n"].get<int64_t>()), static_cast<long long>(is["batch"].get<int64_t>()),
                is["threads"].get<int>(), is["cpu_isa"].get<std::string>().c_str());
    print_header({"path", "FMA peak GFLOP/s", "product", "GEMM GFLOP/s", "of its peak", "of the widest peak",
                  "bf16 limit GFLOP/s", "bf16 GEMM GFLOP/s", "of its limit", "bf16 / fp32"});
    double widest_worst = NAN;
    std::string widest;
    for (const Json& p : is["paths"]) {
      if (!p["available"].get<bool>()) {
        std::string m;
        for (const Json& f : p["missing"]) m += (m.empty() ? "" : ", ") + f.get<std::string>();
        print_row({p["isa"], "not on this CPU (lacks " + m + ")", "", "", "", "", "", "", "", ""});
        continue;
      }
      widest = p["isa"];
      widest_worst = INFINITY;
      for (const char* op : {"forward", "dX", "dW"}) {
        const Json& g = p["gemm_fp32"][op];
        const Json& h = p.contains("gemm_bf16") ? p["gemm_bf16"][op] : Json();
        const char* limit_key = p.contains("tile_peak") ? "tile_peak" : p.contains("dot_peak") ? "dot_peak" : "peak";
        const double limit = num(p[limit_key]["gflops"]);
        widest_worst = std::fmin(widest_worst, num(g["fraction_of_peak"]));
        print_row({p["isa"], fmt(num(p["peak"]["gflops"])), op, fmt(num(g["gflops"])), fmt(num(g["fraction_of_peak"]), 2),
                   fmt(num(g["fraction_of_widest_peak"]), 2), fmt(limit), fmt(num(h["gflops"])),
                   fmt(num(h["fraction_of_limit"]), 2), fmt(num(h["vs_own_fp32"]), 2)});
        // A target: on a CPU with BF16 arithmetic the BF16 products must beat the FP32 ones.
        if (p.contains("dot_peak") || p.contains("tile_peak")) target("bf16 / fp32 GEMM GFLOP/s, " + std::string(op) + " (" + p["isa"].get<std::string>() + ")",
                                           num(h["vs_own_fp32"]), ">", 1.0);
      }
    }
    target("fp32 GEMM, Linear(" + std::to_string(is["n"].get<int64_t>()) + ") products on the widest path (" + widest +
               "), fraction of the in-run FMA peak (worst product)",
           widest_worst, ">=", 0.8);
    std::printf("\n");
    if (is.contains("gelu_1m_glibc")) {
      std::printf("GELU forward + backward, 1M FP32 elements, one thread (median ms): glibc erff/expf loop %s",
                  fmt(num(is["gelu_1m_glibc"]["time"]["median_ms"]), 2).c_str());
      for (const Json& p : is["paths"])
        if (p.contains("gelu_1m"))
          std::printf("; %s %s (%sx)", p["isa"].get<std::string>().c_str(),
                      fmt(num(p["gelu_1m"]["time"]["median_ms"]), 2).c_str(), fmt(num(p["gelu_1m"]["vs_glibc"]), 1).c_str());
      std::printf("\n\n");
    }
  }
  if (doc.contains("train")) {
    std::printf("### Training step, batch 256 (AdamW; belts = fused guard + clip 1.0 + loss scaling for fp16)\n\n");
    print_header({"model", "dtype", "samples/s, plain", "samples/s, belts", "belts overhead", "step ms, belts",
                  "time vs fp32", "allocs/step"});
    const Json& steps = doc["train"]["steps"];
    auto find = [&](const std::string& model, const std::string& dt, bool belts) -> const Json& {
      for (const Json& s : steps)
        if (s["model"] == model && s["dtype"] == dt && s["belts"] == belts) return s;
      static const Json none;
      return none;
    };
    double max_allocs = 0.0;
    for (const Json& s : steps) max_allocs = std::fmax(max_allocs, num(s["system_allocs_per_step"]));
    std::vector<std::string> models;
    for (const Json& s : steps)
      if (std::find(models.begin(), models.end(), s["model"].get<std::string>()) == models.end())
        models.push_back(s["model"]);
    for (const std::string& m : models) {
      const double fp32_ms = num(find(m, "fp32", true)["time"]["median_ms"]);
      for (const char* dt : {"fp32", "bf16", "fp16"}) {
        const Json &off = find(m, dt, false), &on = find(m, dt, true);
        const double overhead = num(on["time"]["median_ms"]) / num(off["time"]["median_ms"]) - 1.0;
        const double vs = num(on["time"]["median_ms"]) / fp32_ms;
        print_row({m, dt, fmt(num(off["samples_per_s"])), fmt(num(on["samples_per_s"])), fmt(100 * overhead, 1) + "%",
                   pm(on["time"]), fmt(vs, 2),
                   fmt(std::fmax(num(off["system_allocs_per_step"]), num(on["system_allocs_per_step"])), 0)});
        if (m.rfind("linear", 0) == 0) {
          target("safety belts overhead, " + m + " " + dt + " step", overhead, "<=", 0.05);
          if (std::string(dt) != "fp32") target(std::string(dt) + " / fp32 " + m + " step time", vs, "<=", 1.5);
          // A target: faster than fp32 where the CPU has the dtype's arithmetic (VDPBF16PS).
          const std::string isa = doc.value("cpu_isa", Json("")).get<std::string>();
          for (const char* bf16_path : {"avx512bf16", "amx"})
            if (std::string(dt) == "bf16" && isa.rfind(std::string(bf16_path) + " ", 0) == 0)
              target("bf16 / fp32 " + m + " step time on " + bf16_path, vs, "<", 1.0);
        }
      }
    }
    target("system allocations per steady-state step (max over configurations)", max_allocs, "<=", 0.0);
    std::printf("\n");
  }
  if (doc.contains("data")) {
    std::printf("### Synthetic data (apps/run/dataset.cpp) vs the belted step it feeds, batch 256, per ISA path\n\n");
    print_header({"path", "model", "dtype", "data ms", "step ms", "data / step"});
    double worst = 0.0;
    for (const Json& r : doc["data"]["rows"]) {
      print_row({r["isa"], r["model"], r["dtype"], pm(r["data"]), pm(r["step"]), fmt(100 * num(r["data_over_step"]), 1) + "%"});
      worst = std::fmax(worst, num(r["data_over_step"]));
    }
    target("synthetic data time / belted step time (worst path and dtype)", worst, "<=", 0.10);
    std::printf("\n");
  }
  if (doc.contains("anomaly")) {
    std::printf("### Anomaly mode (--detect-anomaly): a belted training step with and without it, batch 256\n\n");
    print_header({"model", "dtype", "step ms, plain", "step ms, anomaly mode", "ratio"});
    for (const Json& s : doc["anomaly"]["steps"])
      print_row({s["model"], s["dtype"], pm(s["plain"]), pm(s["anomaly"]), fmt(num(s["ratio"]), 2) + "x"});
    std::printf("\n");
  }
  if (doc.contains("threads")) {
    std::printf("### 1 thread vs 2 threads\n\n");
    print_header({"measure", "1 thread", "2 threads", "speedup"});
    const Json& t = doc["threads"];
    for (auto& [k, v] : t["threads"]["1"].items())
      print_row({k, fmt(num(v), 2), fmt(num(t["threads"]["2"][k]), 2), fmt(num(t["speedup_2_over_1"][k]), 2)});
    std::printf("\n");
  }
  if (!memory.empty()) {
    std::printf("### Memory, Linear training at batch 256\n\n");
    print_header({"model", "dtype", "grads", "state B/param (counted)", "by design", "activations+scratch MiB",
                  "peak RSS MiB", "predicted MiB", "RSS / predicted", "allocator held MiB"});
    for (const Json& m : memory) {
      const double mib = 1048576.0;
      print_row({m["model"], m["dtype"], m["grads"], fmt(num(m["state_bytes_per_param"]), 2),
                 fmt(num(m["state_bytes_per_param_by_design"]), 0),
                 fmt(num(m["activations_and_scratch_at_peak_bytes"]) / mib, 0), fmt(num(m["peak_rss_bytes"]) / mib, 0),
                 fmt(num(m["predicted_peak_rss_bytes"]) / mib, 0), fmt(num(m["peak_rss_over_predicted"]), 3),
                 fmt(num(m["held_rss_bytes"]) / mib, 0)});
      const bool low = m["grads"] != "fp32";
      target(std::string("training state bytes/param, ") + m["dtype"].get<std::string>() + " with " +
                 (low ? "low-precision" : "fp32") + " grads",
             num(m["state_bytes_per_param"]), "<=", low ? 16.0 : 18.0);
      target(std::string("peak RSS / predicted - 1, ") + m["dtype"].get<std::string>() + " " +
                 m["grads"].get<std::string>() + " grads",
             num(m["peak_rss_over_predicted"]) - 1.0, "|x|<=", 0.10);
    }
    std::printf("\n");
  }
  if (doc.contains("rows")) {
    // LayerNorm and softmax rows (bench/rows.cpp): memory-bound passes, against the copy
    // bandwidth measured in the same section.
    const Json& r = doc["rows"];
    std::printf("### LayerNorm and softmax rows, %lld x %lld (copy bandwidth %.1f GB/s, same section)\n\n",
                static_cast<long long>(r["rows"].get<int64_t>()), static_cast<long long>(r["cols"].get<int64_t>()),
                num(r["copy_gb_per_s"]));
    print_header({"op", "pass", "dtype", "ms (median ±IQR)", "GB/s", "of copy BW"});
    for (const Json& o : r["ops"])
      print_row({o["op"], o["pass"], o["dtype"], pm(o["time"]), fmt(num(o["gb_per_s"])),
                 fmt(num(o["fraction_of_copy"]), 2)});
    std::printf("\n");
  }
  // PyTorch on the same CPU (bench/peers/torch_cpu.py; run_all.sh runs it when its venv
  // exists): belay / PyTorch for the rows both timed. It ran in another process after
  // belay's, so on a loaded machine these ratios carry the drift between the two runs.
  std::printf("### PyTorch peer, same CPU and threads\n\n");
  if (!doc.contains("torch")) {
    std::printf("peer absent (no PyTorch venv; bench/peers/setup_torch_venv.sh makes one)\n\n");
    doc["vs_pytorch"] = "peer absent";
  } else {
    const Json& t = doc["torch"];
    Json vs = Json::object();
    if (doc.value("clock", "wall") != t.value("clock", "wall"))
      std::printf("**belay and PyTorch were timed on different clocks: the ratios mean nothing**\n\n");
    std::printf("PyTorch %s (cpu capability %s), %d threads; belay: %s threads, cpu isa %s\n\n",
                t["version"].get<std::string>().c_str(), t["cpu_capability"].get<std::string>().c_str(),
                t["threads"].get<int>(), doc.value("omp_max_threads", Json()).dump().c_str(),
                doc.value("cpu_isa", Json("?")).get<std::string>().c_str());
    if (doc.contains("gemm") && t.contains("gemm")) {
      // GFLOP/s ratio: above 1, belay is faster. belay writes dW in FP32, PyTorch in the
      // operands' dtype (what its autograd does under autocast).
      print_header({"n", "product", "dtype", "belay GFLOP/s", "PyTorch GFLOP/s", "belay / PyTorch"});
      vs["gemm"] = Json::array();
      double worst = INFINITY;
      int64_t largest = 0;
      for (const Json& b : doc["gemm"]["sizes"])
        for (const Json& p : t["gemm"]["sizes"]) {
          if (b["n"] != p["n"]) continue;
          const int64_t n = b["n"].get<int64_t>();
          if (n > largest) worst = INFINITY;  // the target is on the largest n both ran
          largest = std::max(largest, n);
          for (const std::string dt : {"fp32", "bf16", "fp16"})
            for (const char* op : {"forward", "dX", "dW"}) {
              const double bg = num(b["belay_" + dt][op]["gflops"]), tg = num(p[dt][op]["gflops"]);
              print_row({std::to_string(n), op, dt, fmt(bg), fmt(tg), fmt(bg / tg, 2)});
              vs["gemm"].push_back({{"n", n}, {"product", op}, {"dtype", dt}, {"belay_gflops", bg},
                                    {"torch_gflops", tg}, {"belay_over_torch", bg / tg}});
              if (dt == "fp32" && n == largest) worst = std::fmin(worst, bg / tg);
            }
        }
      target("belay fp32 GEMM / PyTorch fp32, Linear(" + std::to_string(largest) + ") products (worst product)", worst,
             ">=", 0.9);
      std::printf("\n");
    }
    if (doc.contains("train") && t.contains("train")) {
      // Step time ratio: below 1, belay is faster. belay's row with the belts (clip,
      // AdamW, loss scaling for fp16) against PyTorch's autocast + GradScaler +
      // clip_grad_norm_ + AdamW step.
      print_header({"model", "dtype", "belay step ms, belts", "PyTorch step ms", "PyTorch AdamW", "belay / PyTorch time"});
      vs["train"] = Json::array();
      for (const Json& p : t["train"]["steps"])
        for (const Json& b : doc["train"]["steps"]) {
          if (b["model"] != p["model"] || b["dtype"] != p["dtype"] || !b["belts"].get<bool>()) continue;
          const std::string model = p["model"], dt = p["dtype"];
          const double ratio = num(b["time"]["median_ms"]) / num(p["time"]["median_ms"]);
          print_row({model, dt, pm(b["time"]), pm(p["time"]), p["optimizer"], fmt(ratio, 2)});
          vs["train"].push_back({{"model", model}, {"dtype", dt}, {"belay_ms", num(b["time"]["median_ms"])},
                                 {"torch_ms", num(p["time"]["median_ms"])}, {"belay_over_torch", ratio}});
          // A target: fp32 no slower than 1.1x PyTorch's; bf16 and fp16 no slower than its.
          if (model.rfind("linear", 0) == 0)
            target(dt + " " + model + " step time, belay (belts) / PyTorch", ratio, "<=", dt == "fp32" ? 1.1 : 1.0);
        }
      std::printf("\n");
    }
    if (doc.contains("amp") && t.contains("amp")) {
      // Time ratio: below 1, belay is faster. PyTorch moves about 48 bytes/param (unscale_,
      // the norm, the in-place clip, fused AdamW), belay's fused step 34.
      print_header({"params", "belay fused ms", "belay unfused ms", "PyTorch ms", "PyTorch AdamW", "belay fused / PyTorch"});
      vs["amp"] = Json::array();
      double speedup = NAN;
      int64_t last = 0;
      for (const Json& p : t["amp"]["sizes"])
        for (const Json& b : doc["amp"]["sizes"]) {
          if (b["params"] != p["params"]) continue;
          const double ratio = num(b["fused"]["time"]["median_ms"]) / num(p["time"]["median_ms"]);
          last = p["params"].get<int64_t>();
          speedup = 1.0 / ratio;
          print_row({std::to_string(last >> 20) + "M", pm(b["fused"]["time"]), pm(b["unfused"]["time"]), pm(p["time"]),
                     p["optimizer"], fmt(ratio, 2)});
          vs["amp"].push_back({{"params", last}, {"belay_fused_ms", num(b["fused"]["time"]["median_ms"])},
                               {"torch_ms", num(p["time"]["median_ms"])}, {"belay_fused_over_torch", ratio}});
        }
      target("PyTorch / belay fused AMP optimizer step time at " + std::to_string(last >> 20) + "M params (belay's speedup)",
             speedup, ">=", 1.3);
      std::printf("\n");
    }
    if (doc.contains("rows") && t.contains("rows")) {
      // Time ratio: below 1, belay is faster (the target, bench/README.md: at or under PyTorch's time, every row).
      print_header({"op", "pass", "dtype", "belay ms", "PyTorch ms", "belay / PyTorch time"});
      vs["rows"] = Json::array();
      double worst = 0.0;
      for (const Json& p : t["rows"]["ops"])
        for (const Json& b : doc["rows"]["ops"]) {
          if (b["op"] != p["op"] || b["pass"] != p["pass"] || b["dtype"] != p["dtype"]) continue;
          const double ratio = num(b["time"]["median_ms"]) / num(p["time"]["median_ms"]);
          worst = std::fmax(worst, ratio);
          print_row({b["op"], b["pass"], b["dtype"], pm(b["time"]), pm(p["time"]), fmt(ratio, 2)});
          vs["rows"].push_back({{"op", b["op"]}, {"pass", b["pass"]}, {"dtype", b["dtype"]},
                                {"belay_ms", num(b["time"]["median_ms"])}, {"torch_ms", num(p["time"]["median_ms"])},
                                {"belay_over_torch", ratio}});
        }
      target("LayerNorm and softmax rows, belay / PyTorch time (worst row)", worst, "<=", 1.0);
      std::printf("\n");
    }
    doc["vs_pytorch"] = vs;
  }
  std::printf("### Targets\n\n");
  print_header({"target", "value", "bound", "verdict"});
  for (const Json& t : targets)
    print_row({t["target"], fmt(num(t["value"]), 3), t["op"].get<std::string>() + " " + fmt(num(t["bound"]), 2),
               t["met"].get<bool>() ? "met" : "MISSED"});
  if (!command.empty()) std::printf("\nRegenerate with: `%s`\n", command.c_str());
  doc["targets"] = targets;
  if (!out_path.empty()) std::ofstream(out_path) << doc.dump(2) << "\n";
  return 0;
}
