#!/usr/bin/env bash
# Builds the CPU benchmarks (Release, CUDA off, in build-bench/) and runs them all:
# one JSON file in bench/results/cpu-<date>.json and the tables on stdout.
#   bench/run_all.sh [--quick]      (--quick: small sizes, a smoke run of every section)
# Environment: BELAY_BENCH_BUILD (build dir), BELAY_BENCH_OUT (results file),
#   BELAY_TORCH_VENV (the PyTorch peer's venv, default <repo>/../venv-torch; made by hand
#   with bench/peers/setup_torch_venv.sh). When that venv exists, bench/peers/torch_cpu.py
#   times the same work in PyTorch at belay's thread count and the report prints
#   belay/PyTorch ratios; without it the report says the peer was absent.
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

# The PyTorch peer runs after belay's programs, never beside them (they would share the
# cores). Its thread count is the one belay_bench ran with (omp_max_threads in its JSON).
venv="${BELAY_TORCH_VENV:-$root/../venv-torch}"
peer=()
if [[ -x "$venv/bin/python" ]]; then
  threads="$("$venv/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["omp_max_threads"])' "$parts/main.json")"
  # A failing peer does not throw away belay's numbers: the report then says it is absent.
  if "$venv/bin/python" "$root/bench/peers/torch_cpu.py" "${quick[@]}" --threads "$threads" --json "$parts/torch.json"; then
    peer=("$parts/torch.json")
  else
    echo "run_all: the PyTorch peer failed (exit $?); reporting without it" >&2
  fi
else
  echo "run_all: PyTorch peer absent (no venv at $venv; bench/peers/setup_torch_venv.sh makes one)" >&2
fi
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, $(uname -m)"
"$build/bench/belay_bench_report" --out "$out" --machine "$machine" \
  --command "bench/run_all.sh${quick:+ --quick}" "$parts/main.json" "$parts"/mem-*.json "${peer[@]}"
echo
echo "results: $out"

# Data parallelism on the CPU (1 and 2 MPI ranks), in a JSON of its own beside the one above;
# skipped (said why) when mpirun or belay's MPI is absent.
if command -v mpirun >/dev/null 2>&1; then
  cmake --build "$build" --target belay >/dev/null
  dist_rc=0
  "$root/bench/dist_scaling.sh" "${quick[@]}" --belay "$build/belay" --out "${out%.json}-dist.json" >/dev/null || dist_rc=$?
  [ $dist_rc -eq 0 ] || echo "run_all: bench/dist_scaling.sh did not run (exit $dist_rc)" >&2
else
  echo "run_all: mpirun absent: no data-parallel numbers (third_party/install_deps.sh installs OpenMPI)" >&2
fi
