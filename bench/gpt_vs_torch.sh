#!/usr/bin/env bash
# The GPT rows (bench/gpt.cpp) beside PyTorch (bench/peers/torch_gpt.py) on this CPU, at one
# thread count: belay and the peer run back to back, ROUNDS times alternately, so drift on a
# shared machine hits both; the table takes each row's median over the rounds and the median
# of the per-round ratios belay / PyTorch.
#   bench/gpt_vs_torch.sh [--rounds N] [--threads N] [--quick] [--long] --out bench/results/NAME
# (--long adds GPT-2 small at context 1024: minutes per round)
# writes NAME.json (every round's numbers, the machine, the load) and NAME.md (the tables).
# One thread: both time the thread's CPU time (--cpu-time), the fair measure on a loaded
# machine; more threads: wall time. Build first (belay_bench in BELAY_BENCH_BUILD, default
# build/); BELAY_TORCH_VENV: the venv of bench/peers/setup_torch_venv.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BELAY_BENCH_BUILD:-$root/build}"
venv="${BELAY_TORCH_VENV:-$root/../venv-torch}"
rounds=3 threads=1 quick=() long=() out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --long) long=(--long); shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: bench/gpt_vs_torch.sh [--rounds N] [--threads N] [--quick] [--long] --out PREFIX" >&2; exit 2 ;;
  esac
done
[[ -n "$out" ]] || { echo "gpt_vs_torch: give --out PREFIX (e.g. bench/results/cpu-DATE-CPU-gpt)" >&2; exit 2; }
[[ -x "$build/bench/belay_bench" ]] || { echo "gpt_vs_torch: no $build/bench/belay_bench: build target belay_bench first" >&2; exit 2; }
[[ -x "$venv/bin/python" ]] || { echo "gpt_vs_torch: no PyTorch venv at $venv (bench/peers/setup_torch_venv.sh)" >&2; exit 2; }
clock=()
[[ "$threads" == 1 ]] && clock=(--cpu-time)

parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
uptime >"$parts/load-start"
for r in $(seq 1 "$rounds"); do
  echo "gpt_vs_torch: round $r of $rounds ($(uptime | sed 's/.*load/load/'))" >&2
  OMP_NUM_THREADS="$threads" "$build/bench/belay_bench" "${quick[@]}" "${long[@]}" "${clock[@]}" --only gpt --json "$parts/belay-$r.json"
  "$venv/bin/python" "$root/bench/peers/torch_gpt.py" "${quick[@]}" "${long[@]}" "${clock[@]}" --threads "$threads" --json "$parts/torch-$r.json"
done
uptime >"$parts/load-end"
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, $(uname -m)"
python3 "$root/bench/peers/gpt_table.py" --machine "$machine" --load-start "$(cat "$parts/load-start")" \
  --load-end "$(cat "$parts/load-end")" --command "bench/gpt_vs_torch.sh --rounds $rounds --threads $threads ${quick[*]} ${long[*]}" \
  --out "$out" "$parts"/belay-*.json "$parts"/torch-*.json
