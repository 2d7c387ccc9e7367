// belay_bench: the CPU benchmark sections in one process, one JSON document out.
//   belay_bench [--quick] [--long] [--cpu-time] [--only stream,amp,gemm,isa,train,data,threads,anomaly,rows,gpt,attention,census,loss] --json FILE
// --cpu-time: times are the thread's CPU time (harness.h), for OMP_NUM_THREADS=1 only.
// A failed result check prints the reason and exits 1: no number is written for it.
#include <omp.h>

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "bench/sections.h"
#include "engine/error.h"
#include "engine/whole_lines.h"
#include "kernels/cpu/cpu_isa.h"

using namespace belay::bench;

namespace {

std::set<std::string> split(const std::string& s) {
  std::set<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.insert(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  belay::print_whole_lines();  // every line in one write()
  Options o;
  std::string json_path;
  std::set<std::string> only{"stream", "amp", "gemm", "isa", "train", "data", "threads", "anomaly", "rows", "gpt", "attention", "census", "loss"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") o.quick = true;
    else if (a == "--long") o.long_rows = true;
    else if (a == "--cpu-time") thread_cpu_clock() = true;
    else if (a == "--only" && i + 1 < argc) only = split(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::cerr << "usage: belay_bench [--quick] [--long] [--cpu-time] [--only stream,amp,gemm,isa,train,data,threads,anomaly,rows,gpt,attention,census,loss] --json FILE\n";
      return 2;
    }
  }
  if (thread_cpu_clock() && omp_get_max_threads() != 1) {
    std::cerr << "belay_bench: error: --cpu-time counts one thread's CPU time; run it with OMP_NUM_THREADS=1\n";
    return 2;
  }
  Json doc;
  try {  // the CPU kernels' path: BELAY_CPU_ISA or the widest this CPU has
    doc = Json{{"quick", o.quick},
               {"long", o.long_rows},
               {"omp_max_threads", omp_get_max_threads()},
               {"cpu_isa", belay::cpu_isa_report()},
               {"clock", thread_cpu_clock() ? "thread_cpu" : "wall"}};
  } catch (const std::exception& e) {
    std::cerr << "belay_bench: error: " << e.what() << "\n";
    return 2;
  }
  const std::pair<const char*, Json (*)(const Options&)> sections[] = {
      {"stream", bench_stream}, {"amp", bench_amp}, {"gemm", bench_gemm}, {"isa", bench_isa}, {"train", bench_train}, {"data", bench_data}, {"threads", bench_threads},
      {"anomaly", bench_anomaly}, {"rows", bench_rows}, {"gpt", bench_gpt}, {"attention", bench_attention},
      {"census", bench_census}, {"loss", bench_loss}};
  try {
    for (auto [name, fn] : sections) {
      if (!only.count(name)) continue;
      std::cerr << "belay_bench: " << name << "..." << std::flush;
      const double t0 = now_ms();
      doc[name] = fn(o);
      std::cerr << " " << static_cast<int>((now_ms() - t0) / 1000) << " s\n";
    }
  } catch (const CheckFailure& e) {
    std::cerr << "\nbelay_bench: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "\nbelay_bench: error: " << e.what() << "\n";
    return 1;
  }
  if (json_path.empty()) {
    std::cout << doc.dump(2) << "\n";
  } else {
    std::ofstream(json_path) << doc.dump(2) << "\n";
  }
  return 0;
}
