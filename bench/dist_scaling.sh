#!/usr/bin/env bash
# Data parallelism on the CPU: samples/s of one process and of 1 and 2 MPI ranks
# (mpirun -np 1/2 belay train --dist mpi) on an MLP whose gradients are tens of MB, with
# each rank's gradient all-reduce time, bytes, bucket count and the fraction of the run the
# sync takes (belay's own counters: `dist mpi:` lines of rank 0).
#   bench/dist_scaling.sh [--quick] [--belay PATH] [--out FILE.json] [--bucket-mb MB]
# Default PATH: build-bench/belay (built here, Release, CUDA off, if absent). Without --out
# the JSON goes to stdout only: write it under bench/results/ only from a quiet machine.
#
# Threads: 2 ranks on C cores get C/2 OpenMP threads each (at least 1), so the ranks share
# the machine instead of fighting for it; one process (or one rank) gets all C, and once
# more C/2 (local_1t: what each of the 2 ranks has, the base their scaling is read against). On a machine with few
# cores, 2 ranks cannot beat one process (the same cores, plus the sync): what this then
# shows is the price of the sync, not a speed-up. Each configuration runs `reps` times and
# the fastest run is kept (the least disturbed by other work on the machine).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
belay="" out="" quick=0 bucket_mb=25
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --belay) belay="$2"; shift ;;
    --out) out="$2"; shift ;;
    --bucket-mb) bucket_mb="$2"; shift ;;
    *) echo "dist_scaling: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$belay" ]; then
  build="$root/build-bench"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBELAY_ENABLE_CUDA=OFF -DBUILD_TESTING=OFF >/dev/null
  cmake --build "$build" --target belay >/dev/null
  belay="$build/belay"
fi
command -v mpirun >/dev/null || { echo "dist_scaling: mpirun not found (third_party/install_deps.sh)" >&2; exit 77; }
"$belay" train --dist mpi --steps 1 --quiet >/dev/null 2>&1 ||
  { echo "dist_scaling: this belay has no MPI (--dist mpi fails)" >&2; exit 77; }

# 4 layers, in 1024, hidden 2048, out 16: 10.5M parameters, 42 MB of FP32 gradient (two
# buckets of 25 MB). --quick: hidden 512 (0.8M parameters, 3.3 MB), a smoke run.
hidden=2048 steps=30 reps=3
[ $quick -eq 1 ] && { hidden=512; steps=10; reps=1; }
batch=64
cores=$(nproc)
model=(--model mlp --in 1024 --hidden $hidden --layers 4 --out 16 --batch $batch --steps $steps --dtype fp32 --seed 1)
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=passive

load_at_start="$(cut -d' ' -f1-3 /proc/loadavg)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# run NAME RANKS THREADS [ARGS...]: the fastest of `reps` runs, as "seconds sync wait bytes buckets during done".
run() {
  local name=$1 ranks=$2 threads=$3 best="" r line
  shift 3
  for r in $(seq $reps); do
    if [ "$ranks" = 0 ]; then
      OMP_NUM_THREADS=$threads "$belay" train "${model[@]}" >"$tmp/$name.out" 2>&1
    else
      OMP_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
        -x OMP_NUM_THREADS -x OMP_WAIT_POLICY "$belay" train --dist mpi --bucket-mb "$bucket_mb" "${model[@]}" "$@" \
        >"$tmp/$name.out" 2>&1
    fi
    line=$(awk '
      /^done:/ { for (i = 1; i <= NF; ++i) if ($i == "in") secs = $(i + 1) }
      /^dist mpi: [0-9]+ ranks/ { for (i = 1; i <= NF; ++i) if ($i == "bytes,") bytes = $(i - 1) }
      /^dist mpi: [0-9]+ buckets/ { buckets = $3; match($0, /\(([0-9]+) started/); during = substr($0, RSTART + 1, RLENGTH - 9)
        match($0, /, [0-9]+ done/); done = substr($0, RSTART + 2, RLENGTH - 7)
        match($0, /sync [0-9.e+-]+ s/); sync = substr($0, RSTART + 5, RLENGTH - 7)
        match($0, /waiting [0-9.e+-]+ s/); wait = substr($0, RSTART + 8, RLENGTH - 10) }
      END { printf "%s %s %s %s %s %s %s", secs, (sync == "" ? 0 : sync), (wait == "" ? 0 : wait), (bytes == "" ? 0 : bytes),
            (buckets == "" ? 0 : buckets), (during == "" ? 0 : during), (done == "" ? 0 : done) }' "$tmp/$name.out")
    if [ -z "$best" ] || awk -v a="${line%% *}" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then best=$line; fi
  done
  echo "$best"
}

threads_of() { local t=$((cores / $1)); [ $t -lt 1 ] && t=1; echo $t; }
results=()
# local_1t: one process on as many threads as each of 2 ranks gets (what 2 ranks scale from).
# mpi_np2_pt: 2 ranks with --dist-progress-thread (a thread moves the buckets during backward).
for cfg in "local 0 all" "local_1t 0 half" "mpi_np1 1 all" "mpi_np2 2 half" "mpi_np2_pt 2 half --dist-progress-thread"; do
  set -- $cfg
  name=$1 ranks=$2 share=$3
  shift 3
  threads=$(threads_of $([ "$share" = all ] && echo 1 || echo 2))
  read -r secs sync wait bytes buckets during done <<<"$(run "$name" "$ranks" "$threads" "$@")"
  sps=$(awk -v s="$secs" -v n=$((steps * batch)) 'BEGIN { printf "%.1f", n / s }')
  frac=$(awk -v a="$sync" -v s="$secs" 'BEGIN { printf "%.4f", a / s }')
  printf '%-10s ranks %d x %d threads: %8s samples/s  (%s s for %d steps); sync %s s (%s of the run), waiting %s s, %s bytes/rank in %s buckets (%s started during backward, %s done before it ended)\n' \
    "$name" $((ranks > 0 ? ranks : 1)) "$threads" "$sps" "$secs" "$steps" "$sync" "$frac" "$wait" "$bytes" "$buckets" "$during" "$done" >&2
  results+=("{\"name\": \"$name\", \"ranks\": $((ranks > 0 ? ranks : 1)), \"threads_per_rank\": $threads, \"seconds\": $secs, \"samples_per_sec\": $sps, \"gradient_sync_seconds\": $sync, \"sync_fraction\": $frac, \"gradient_wait_seconds\": $wait, \"gradient_bytes_per_rank\": $bytes, \"buckets\": $buckets, \"buckets_during_backward\": $during, \"buckets_done_before_backward_ended\": $done}")
done

params=$((1024 * hidden + hidden + 2 * (hidden * hidden + hidden) + hidden * 16 + 16))
json="{
  \"benchmark\": \"dist_scaling\",
  \"command\": \"bench/dist_scaling.sh$([ $quick -eq 1 ] && echo ' --quick')\",
  \"machine\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $cores cores\",
  \"load_average_at_start\": \"$load_at_start\",
  \"model\": \"mlp 1024-$hidden-$hidden-$hidden-16, $params parameters, fp32, batch $batch (effective), $steps steps, bucket $bucket_mb MB\",
  \"kept\": \"fastest of $reps runs\",
  \"runs\": [
    $(IFS=,; echo "${results[*]}" | sed 's/},{/},\n    {/g')
  ]
}"
echo "$json"
[ -n "$out" ] && { mkdir -p "$(dirname "$out")"; echo "$json" >"$out"; echo "dist_scaling: wrote $out" >&2; }
exit 0
