#!/usr/bin/env bash
# Builds the CPU benchmarks (Release, CUDA off, in build-bench/) and runs them all:
# one JSON file in bench/results/cpu-<date>.json and the tables on stdout.
#   bench/run_all.sh [--quick]      (--quick: small sizes, a smoke run of every section)
# Environment: BELAY_BENCH_BUILD (build dir), BELAY_BENCH_OUT (results file).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BELAY_BENCH_BUILD:-$root/build-bench}"
quick=()
[[ "${1:-}" == "--quick" ]] && quick=(--quick)
stamp="$(date +%Y-%m-%d)"
out="${BELAY_BENCH_OUT:-$root/bench/results/cpu-$stamp${quick:+-quick}.json}"
mkdir -p "$(dirname "$out")"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBELAY_ENABLE_CUDA=OFF -DBUILD_TESTING=OFF >/dev/null
cmake --build "$build" --target belay_bench belay_bench_memory belay_bench_report >/dev/null

parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
"$build/bench/belay_bench" "${quick[@]}" --json "$parts/main.json"
n=4096
[[ ${#quick[@]} -gt 0 ]] && n=1024
for cfg in "fp32 fp32" "bf16 fp32" "fp16 fp32" "bf16 low" "fp16 low"; do
  set -- $cfg
  "$build/bench/belay_bench_memory" --dtype "$1" --grads "$2" --in "$n" --json "$parts/mem-$1-$2.json"
done
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, $(uname -m)"
"$build/bench/belay_bench_report" --out "$out" --machine "$machine" \
  --command "bench/run_all.sh${quick:+ --quick}" "$parts/main.json" "$parts"/mem-*.json
echo
echo "results: $out"
