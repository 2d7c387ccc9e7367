#!/usr/bin/env bash
# ONE prepared run for a lent GPU (an H200, sm_90), within BELAY_GPU_CHECK_BUDGET_S (default
# 420 s: every stage's timeout is cut to what is left of it, so a run ends by then whatever
# hangs, and a rerun on the still-warm machine, whose build is kept, fits in the session too):
#   1. configure for sm_90 only into build-gpu-check/, build what the checks need
#      (the ptxas register/spill report of every kernel is kept: $OUT/ptxas-table.txt)
#   2. ctest -L gpu (every CUDA op against the CPU, the guard's inf/NaN hunt, 200-step runs)
#   3. bench/gpu/gpu_bench.cu: GEMM vs cuBLAS at 1024..8192 fp16/bf16 (and the two backward
#      layouts at 4096; again for each variant of the tensor-core GEMM in GEMM_VARIANTS below,
#      each built in build-gpu-check-<name>/ while the tests run), guard + AdamW vs the
#      device copy bandwidth
#   4. bench/gpu/torch_amp_step.py: PyTorch GradScaler + clip_grad_norm_ + AdamW(fused=True)
#      on the same tensors
#   4b. bench/gpu/torch_sdpa.py: PyTorch's scaled_dot_product_attention, forward and forward +
#      backward, at the shape of gpu_bench's attention section (B 4, H 12, T 1024, d 64, causal)
#   5. beside each measured time, the time at the H200's limits (bench/gpu/expected_column.py)
# Writes $OUT/gpu-check.log (everything), $OUT/summary.json and the pieces it is made of.
# Usage: OUT=/some/dir bench/gpu-check.sh   (from anywhere; default OUT=./gpu-check-out)
# The lent machine has nvcc, CMake, ninja and PyTorch but none of Debian's -dev packages and
# no network: gather them here first, and carry the folder (git-ignored) with the run:
#   bash third_party/vendor_gpu_deps.sh          # -> third_party/vendored/ (~14 MB), once
#   device run: command "bash bench/gpu-check.sh", carry ["third_party/vendored"], timeout_s 480
# When third_party/vendored/usr exists it is passed as BELAY_DEPS_PREFIX (searched first).
# tests/install/gpu_check_rehearsal.sh rehearses the configure on a CPU machine with the
# system's copies hidden (CI runs it). No MPI there: the --dist nccl stage says it is skipped.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIGURE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
if [ -d "$ROOT/third_party/vendored/usr" ]; then
  CONFIGURE_ARGS+=("-DBELAY_DEPS_PREFIX=$ROOT/third_party/vendored/usr")
fi
# tests/install/gpu_check_rehearsal.sh: the configure line alone, into BUILD, with extra args.
if [ "${1:-}" = "--configure-only" ]; then
  exec cmake -S "$ROOT" -B "${2:?usage: gpu-check.sh --configure-only BUILD [CMAKE_ARGS...]}" "${CONFIGURE_ARGS[@]}" "${@:3}"
fi
OUT="${OUT:-$PWD/gpu-check-out}"
BUILD="$ROOT/build-gpu-check"
JOBS="$(nproc 2>/dev/null || echo 8)"
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
BUDGET="${BELAY_GPU_CHECK_BUDGET_S:-420}"
stamp() { echo "== [$(( $(date +%s) - START )) s] $*"; }
# cap SECONDS: the stage's own limit, cut to what the budget has left once 20 s are kept for
# the summary (at least 1: `timeout 0` would mean no limit at all). budget_left SECONDS: is
# that much left? If not, the stage is skipped and says so.
left_s() { echo $(( START + BUDGET - 20 - $(date +%s) )); }
cap() { local left; left=$(left_s); (( left < 1 )) && left=1; echo $(( $1 < left ? $1 : left )); }
budget_left() { (( $(left_s) >= $1 )) || { stamp "skipped: less than $1 s of the ${BUDGET} s budget left"; return 1; }; }
# torch_peer NAME NEEDS CAP: the PyTorch peer bench/gpu/NAME.py, if NEEDS seconds are left, for at
# most CAP of them, into $OUT/NAME.json (its stderr in NAME.err), else a JSON error saying why.
torch_peer() {
  local json="$OUT/$1.json"
  if ! budget_left "$2"; then
    echo '{"error": "skipped: budget spent"}' > "$json"
  elif ! timeout "$(cap "$3")" python3 "$ROOT/bench/gpu/$1.py" > "$json" 2> "$OUT/$1.err"; then
    echo "{\"error\": \"bench/gpu/$1.py failed\"}" > "$json"; tail -5 "$OUT/$1.err"
  fi
  cat "$json"
}

stamp "belay gpu-check at $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi: not available"

stamp "configure (sm_90)"
if ! timeout "$(cap 90)" cmake -S "$ROOT" -B "$BUILD" "${CONFIGURE_ARGS[@]}" > "$OUT/configure.log" 2>&1; then
  stamp "configure FAILED: nothing else can run"; tail -30 "$OUT/configure.log"
  [ -d "$ROOT/third_party/vendored/usr" ] ||
    echo "no third_party/vendored/: run third_party/vendor_gpu_deps.sh where the packages are, and carry it"
  exit 1
fi

stamp "build"
timeout "$(cap 240)" cmake --build "$BUILD" -j "$JOBS" --target belay_core belay_train belay belay_gpu_tests > "$OUT/build.log" 2>&1
BUILD_RC=$?
grep -E "error|FAILED" "$OUT/build.log" | head -20
stamp "build rc=$BUILD_RC"
# The per-kernel table (registers, stack, spills) and the check CI applies, for sm_90 here.
ARCHS=sm_90 bash "$ROOT/tests/kernels/check_ptxas.sh" "$OUT/build.log" "$OUT/ptxas-table.txt"

stamp "bench binary (links belay_core and cuBLAS)"
# The CMake target exists once bench/CMakeLists.txt adds bench/gpu; until then, nvcc directly.
BENCH_BIN="$(find "$BUILD" -name belay_gpu_bench -type f -perm -u+x 2>/dev/null | head -1)"
if timeout "$(cap 120)" cmake --build "$BUILD" -j "$JOBS" --target belay_gpu_bench > "$OUT/bench-build.log" 2>&1; then
  BENCH_BIN="$(find "$BUILD" -name belay_gpu_bench -type f -perm -u+x | head -1)"
else
BENCH_BIN="$BUILD/belay_gpu_bench"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
timeout "$(cap 120)" "$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -I"$ROOT" \
  -DBELAY_HAVE_CUDA=1 "$ROOT/bench/gpu/gpu_bench.cu" "$BUILD/libbelay_core.a" -lcublas -Xcompiler -fopenmp \
  -o "$BENCH_BIN" >> "$OUT/bench-build.log" 2>&1 || { stamp "bench build FAILED"; tail -20 "$OUT/bench-build.log"; }
fi

# Variants of the tensor-core GEMM (its build options, kernels/cuda/gemm_layout.h), each
# "name:cmake args", built side by side in build-gpu-check-<name>/ while the tests run (only
# the bench binary: ~40 s of a 16-core machine each); only their GEMM section is run, to see
# which is fastest on this GPU. A screening run on the H200
# (bench/results/gpu-2026-12-04-h200-gemm-variants) found the larger tiles worth at most 4%
# (the 8-warp 64 x 32 grid, BELAY_GEMM_WARPS_N=4, was slower: 0.32-0.35 of cuBLAS), so:
# the second run (bench/results/gpu-2026-12-04-h200-2) found the hoisted address math 7-21%
# faster, so it is the default since, and:
#   nohoist:  the default tile with the address math in the k loop (the former default);
#   bn256s4h: 128 x 256 tiles, 8 warps of 64 x 64, 4 stages (192 KiB), hoisted.
# BELAY_GPU_CHECK_GEMM_VARIANTS="name:args;name:args" (empty: none) measures others.
GEMM_VARIANTS_DEFAULT="nohoist:-DBELAY_GEMM_HOIST=0"
GEMM_VARIANTS_DEFAULT+=";bn256s4h:-DBELAY_GEMM_BN=256 -DBELAY_GEMM_STAGES=4 -DBELAY_GEMM_HOIST=1"
IFS=';' read -r -a GEMM_VARIANTS <<< "${BELAY_GPU_CHECK_GEMM_VARIANTS-$GEMM_VARIANTS_DEFAULT}"
# The cores left by the tests (ctest -j 4), shared among the variant builds.
VARIANT_JOBS=$(( JOBS > 3 + ${#GEMM_VARIANTS[@]} ? (JOBS - 4) / (${#GEMM_VARIANTS[@]} > 0 ? ${#GEMM_VARIANTS[@]} : 1) : 1 ))
# Every GEMM option reset to its default first: a build folder kept from an earlier run
# holds the options it was configured with in its cache.
GEMM_DEFAULTS=(-DBELAY_GEMM_BM=128 -DBELAY_GEMM_BN=128 -DBELAY_GEMM_WARPS_N= -DBELAY_GEMM_STAGES=3
               -DBELAY_GEMM_GROUP_M=1 -DBELAY_GEMM_HOIST=1)
declare -A VARIANT_PID
for variant in "${GEMM_VARIANTS[@]}"; do
  name="${variant%%:*}"; read -r -a args <<< "${variant#*:}"
  ( timeout "$(cap 90)" cmake -S "$ROOT" -B "$ROOT/build-gpu-check-$name" "${CONFIGURE_ARGS[@]}" "${GEMM_DEFAULTS[@]}" "${args[@]}" \
      -DBUILD_TESTING=OFF > "$OUT/build-$name.log" 2>&1 &&
    timeout "$(cap 240)" cmake --build "$ROOT/build-gpu-check-$name" -j "$VARIANT_JOBS" --target belay_gpu_bench \
      >> "$OUT/build-$name.log" 2>&1 ) &
  VARIANT_PID[$name]=$!
done

stamp "ctest -L gpu"
( cd "$BUILD" && timeout "$(cap 180)" ctest -L gpu --output-on-failure --timeout 90 -j 4 ) > "$OUT/ctest-gpu.log" 2>&1
CTEST_RC=$?
tail -40 "$OUT/ctest-gpu.log"
PASSED=$(grep -oE "[0-9]+% tests passed(, [0-9]+ tests failed)? out of [0-9]+" "$OUT/ctest-gpu.log" | tail -1)
stamp "ctest rc=$CTEST_RC: $PASSED"

# One process per section: a kernel that takes the CUDA context down costs only its own.
for section in gemm step sync attention; do
  stamp "gpu_bench --section $section"
  if [ -x "$BENCH_BIN" ] && budget_left 30; then
    timeout "$(cap 90)" "$BENCH_BIN" --section $section > "$OUT/gpu_bench_$section.json" 2> "$OUT/gpu_bench_$section.err"
    echo "rc=$?"
    cat "$OUT/gpu_bench_$section.err"
  else
    echo '{"error": "bench binary not built"}' > "$OUT/gpu_bench_$section.json"
  fi
done

: > "$OUT/gemm-variants.txt"  # name, cmake args, build rc: the summary reads it
for variant in "${GEMM_VARIANTS[@]}"; do
  name="${variant%%:*}"
  stamp "gpu_bench --section gemm, variant $name (${variant#*:})"
  wait "${VARIANT_PID[$name]}"; rc=$?; echo "$name build rc=$rc"
  printf '%s\t%s\t%s\n' "$name" "${variant#*:}" "$rc" >> "$OUT/gemm-variants.txt"
  # Registers and spills of the variant's kernels (its build log holds ptxas's report).
  ARCHS=sm_90 bash "$ROOT/tests/kernels/check_ptxas.sh" "$OUT/build-$name.log" "$OUT/ptxas-table-$name.txt" | tail -1
  bin="$(find "$ROOT/build-gpu-check-$name" -name belay_gpu_bench -type f -perm -u+x 2>/dev/null | head -1)"
  if [ "$rc" = 0 ] && [ -x "$bin" ] && budget_left 30; then  # a stale binary of an earlier build is not run
    timeout "$(cap 60)" "$bin" --section gemm > "$OUT/gpu_bench_$name.json" 2> "$OUT/gpu_bench_$name.err"; echo "rc=$?"
    cat "$OUT/gpu_bench_$name.err"
  else
    tail -20 "$OUT/build-$name.log"
    echo "{\"error\": \"$name bench binary not built, or no budget\"}" > "$OUT/gpu_bench_$name.json"
  fi
done

stamp "PyTorch reference step"
torch_peer torch_amp_step 30 60
torch_peer torch_sdpa 20 45

stamp "belay train on cuda vs cpu (the README demo, fp16 with an inf at step 5; and a larger MLP)"
BELAY_BIN="$(find "$BUILD" -maxdepth 2 -name belay -type f -perm -u+x | head -1)"
if [ -x "$BELAY_BIN" ] && budget_left 30; then
  for dev in cpu cuda; do
    timeout "$(cap 45)" "$BELAY_BIN" train --device $dev --dtype fp16 --steps 200 --inject-inf 5 --quiet \
      --csv "$OUT/train-$dev.csv" > "$OUT/train-$dev.out" 2>&1; echo "train $dev rc=$?"
  done
  # A larger run, timed by belay itself ("done: N steps ... in S s"): a 68M-parameter MLP
  # whose data is small (in 64, out 8: the synthetic batches are made on the host, and must
  # not be what is timed). Steps are enqueued with no host wait, rows read one step late.
  # The same run again waiting for each step's row (as a loop reading found_inf on the host
  # would): the ratio of the two is what the asynchronous step saves.
  for mode in async sync; do
    extra=""; [ $mode = sync ] && extra="--sync-each-step"
    timeout "$(cap 45)" "$BELAY_BIN" train --device cuda --model mlp --in 64 --hidden 8192 --layers 3 --out 8 --batch 512 \
      --dtype bf16 --clip 1 --steps 200 $extra --csv "$OUT/train-mlp-cuda-$mode.csv" > "$OUT/train-mlp-cuda-$mode.out" 2>&1
    echo "mlp cuda $mode rc=$?"; tail -1 "$OUT/train-mlp-cuda-$mode.out"
  done
fi

stamp "--dist nccl: one rank (and one per GPU where there are several) against the same run without --dist"
# One rank: NCCL's sum over one rank is the identity, so the CSV must be the same bytes as the
# local run's (the buckets, the second stream and the agreement round trip all exercised).
# Where several GPUs are visible, one rank per GPU: samples/s and the sync time per rank.
NGPU="$("$BELAY_BIN" info 2>/dev/null | sed -n 's/.*cuda built: \([0-9]*\) device.*/\1/p')"
if [ -x "$BELAY_BIN" ] && command -v mpirun >/dev/null 2>&1 && [ "${NGPU:-0}" -gt 0 ] && budget_left 60; then
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  NCCL_RUN=(train --device cuda --model mlp --in 64 --hidden 4096 --layers 4 --out 8 --batch 512 --dtype bf16
            --clip 1 --steps 100 --bucket-mb 25)
  timeout "$(cap 45)" "$BELAY_BIN" "${NCCL_RUN[@]}" --csv "$OUT/nccl-local.csv" > "$OUT/nccl-local.out" 2>&1
  echo "local rc=$?"; tail -1 "$OUT/nccl-local.out"
  for np in 1 $([ "$NGPU" -gt 1 ] && echo "$NGPU"); do
    timeout "$(cap 60)" mpirun --allow-run-as-root --oversubscribe -np $np "$BELAY_BIN" "${NCCL_RUN[@]}" --dist nccl \
      --csv "$OUT/nccl-$np.csv" > "$OUT/nccl-$np.out" 2>&1
    echo "nccl -np $np rc=$?"; grep -E '^(done|dist|belay: error)' "$OUT/nccl-$np.out"
  done
  cmp "$OUT/nccl-local.csv" "$OUT/nccl-1.csv" && echo "nccl -np 1: the CSV equals the local run's, byte for byte"
  # The 2-rank case (tests/dist/nccl_test.sh runs it on the emulated device in CI): the skip and
  # scale columns must equal the local run's (the belts agreed across ranks), the losses close.
  if [ "$NGPU" -ge 2 ]; then
    [ "$NGPU" -gt 2 ] && timeout 90 mpirun --allow-run-as-root --oversubscribe -np 2 "$BELAY_BIN" "${NCCL_RUN[@]}" \
      --dist nccl --csv "$OUT/nccl-2.csv" > "$OUT/nccl-2.out" 2>&1
    if diff <(cut -d, -f1,2,6,7,8 "$OUT/nccl-local.csv") <(cut -d, -f1,2,6,7,8 "$OUT/nccl-2.csv") >/dev/null; then
      echo "nccl -np 2: step/lr/skip/scale columns equal the local run's; worst loss difference (relative):" \
        "$(paste -d, "$OUT/nccl-local.csv" "$OUT/nccl-2.csv" | awk -F, 'NR > 1 { d = ($5 - $13) / $5; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.3g", w }')"
    else
      echo "nccl -np 2: FAILED: the belt columns differ from the local run's"
    fi
    # Sharded optimizer state (--shard-optimizer: ncclReduceScatter of packed buckets,
    # ncclAllGather of the updated parameters; nccl_test.sh runs it emulated in CI): the same
    # belt columns as the local run, the losses beside the unsharded 2-rank run's (it clips, and
    # the sharded norm groups the guard's sums per tensor: last bits may differ), and the
    # per-rank memory line.
    timeout 90 mpirun --allow-run-as-root --oversubscribe -np 2 "$BELAY_BIN" "${NCCL_RUN[@]}" --dist nccl \
      --shard-optimizer --csv "$OUT/nccl-sharded-2.csv" > "$OUT/nccl-sharded-2.out" 2>&1
    echo "nccl -np 2 --shard-optimizer rc=$?"; grep -E '^(done|dist|memory|belay: error)' "$OUT/nccl-sharded-2.out"
    if diff <(cut -d, -f1,2,6,7,8 "$OUT/nccl-local.csv") <(cut -d, -f1,2,6,7,8 "$OUT/nccl-sharded-2.csv") >/dev/null; then
      echo "nccl -np 2 sharded: step/lr/skip/scale columns equal the local run's; worst loss difference from the unsharded 2-rank run (relative):" \
        "$(paste -d, "$OUT/nccl-2.csv" "$OUT/nccl-sharded-2.csv" | awk -F, 'NR > 1 { d = ($5 - $13) / $5; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.3g", w }')"
    else
      echo "nccl -np 2 sharded: FAILED: the belt columns differ from the local run's"
    fi
  else
    echo "skipped: nccl -np 2 needs 2 GPUs, this machine has $NGPU"
    # One GPU, two ranks: refused before NCCL starts, with one line (the device is the rank's
    # index on its node, and two ranks must not share a GPU).
    timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$BELAY_BIN" "${NCCL_RUN[@]}" --dist nccl \
      > "$OUT/nccl-shared.out" 2>&1
    echo "nccl -np 2 on 1 GPU rc=$? (want 2): $(grep -m1 '^belay: error' "$OUT/nccl-shared.out")"
  fi
else
  echo "skipped: no belay binary, no mpirun, or no GPU"
fi

stamp "GPT-2-small-shaped training step (12 layers, width 768, 12 heads, context 1024, batch 4, vocab 256) on cuda, beside PyTorch"
# belay's run times itself from its start, so two runs of 10 and 40 steps are timed and their
# difference taken: 30 steady steps, set-up and first steps cancelled out. PyTorch's peer
# (bench/gpu/torch_gpt_step.py) is the same model in eager mode with SDPA and fused AdamW.
# The byte tokens file is made where Debian's Python sources are and carried:
#   python3 apps/data/make_text_corpus.py -o build-gpu-data/text.safetensors
GPT_DATA="${BELAY_GPU_CHECK_GPT_DATA:-$ROOT/build-gpu-data/text.safetensors}"
GPT_RUN=(train --device cuda --model gpt --layers 12 --width 768 --heads 12 --context 1024 --batch 4
         --schedule constant --eval-every 0 --clip 1 --data "$GPT_DATA")
if [ -x "$BELAY_BIN" ] && [ -f "$GPT_DATA" ] && budget_left 60; then
  for dtype in bf16 fp16; do
    for steps in 10 40; do
      timeout "$(cap 60)" "$BELAY_BIN" "${GPT_RUN[@]}" --dtype $dtype --steps $steps \
        --csv "$OUT/gpt-cuda-$dtype-$steps.csv" > "$OUT/gpt-cuda-$dtype-$steps.out" 2>&1
      echo "gpt cuda $dtype $steps steps rc=$?"; grep -E '^(done|belay: error)' "$OUT/gpt-cuda-$dtype-$steps.out"
    done
  done
else
  echo "skipped: no belay binary, no tokens file at $GPT_DATA, or no budget"
fi
torch_peer torch_gpt_step 40 120

stamp "where the GPT step's GPU time goes (nsys's kernel summary of 10 bf16 steps, where nsys is installed)"
# The per-kernel table (time, calls, average) is what the next round of GPU work reads: which
# kernel of the step is far from its limit. Without nsys the stage says so and nothing else.
NSYS="$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)"
if [ -n "$NSYS" ] && [ -x "$BELAY_BIN" ] && [ -f "$GPT_DATA" ] && budget_left 60; then
  timeout "$(cap 90)" "$NSYS" profile --force-overwrite true -o "/tmp/gpt-bf16-nsys" --trace cuda \
    "$BELAY_BIN" "${GPT_RUN[@]}" --dtype bf16 --steps 10 > "$OUT/gpt-nsys.out" 2>&1
  echo "nsys profile rc=$?"
  timeout "$(cap 60)" "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$OUT/gpt-nsys" /tmp/gpt-bf16-nsys.nsys-rep > /dev/null 2>&1
  echo "nsys stats rc=$?"; head -25 "$OUT"/gpt-nsys*.csv 2>/dev/null | cut -c1-220
else
  echo "skipped: no nsys (looked on PATH, /usr/local/cuda/bin, /opt/nvidia), no binary or tokens, or no budget"
fi

stamp "summary"
python3 - "$OUT" "$BUILD_RC" "$CTEST_RC" "$PASSED" <<'PY'
import json, sys, os, re
out, build_rc, ctest_rc, passed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"{name}: {e}"}
bench = {}
for section in ("gemm", "step", "sync", "attention"):
    part = load(f"gpu_bench_{section}.json")
    if "error" in part: part = {section: part}
    bench.update(part)
torch_step = load("torch_amp_step.json")
# The GEMM variants (gemm-variants.txt: name, cmake args, build rc) and their measurements.
variants = {}
try:
    for line in open(os.path.join(out, "gemm-variants.txt")):
        name, args, rc = line.rstrip("\n").split("\t")
        variants[name] = {"cmake": args, "build_rc": int(rc)}
except OSError:
    pass
variant_bench = {name: load(f"gpu_bench_{name}.json") for name in variants}
# Kernels with spills, from check_ptxas.sh's table ("... ST/LD B spill st/ld  KERNEL").
spills = []
try:
    for line in open(os.path.join(out, "ptxas-table.txt")):
        m = re.search(r"(\S+)/(\S+)\s+B spill st/ld  (.*)", line)
        if m and (m.group(1), m.group(2)) != ("0", "0"): spills.append(m.group(3))
except OSError:
    spills = ["no ptxas table"]
summary = {"build_rc": build_rc, "ctest_rc": ctest_rc, "ctest": passed, "kernels_with_spills": spills,
           "gemm_warps": bench.get("gemm_warps"), "gemm_config": bench.get("gemm_config"),
           "gemm_blocks_per_sm": bench.get("gemm_blocks_per_sm"), "gemm": bench.get("gemm"),
           "gemm_variants": variants, "step": bench.get("step"), "sync": bench.get("sync"),
           "torch_step": torch_step, "attention": bench.get("attention"), "torch_sdpa": load("torch_sdpa.json")}
step = bench.get("step") or {}
if step.get("step_ms") and torch_step.get("step_ms"):
    summary["belay_step_speedup_over_torch"] = round(torch_step["step_ms"] / step["step_ms"], 3)
for name, b in variant_bench.items():
    variants[name].update(config=b.get("gemm_config"), blocks_per_sm=b.get("gemm_blocks_per_sm"))
    try:  # kernels of the variant with spills (its ptxas table, sm_90)
        variants[name]["kernels_with_spills"] = [
            m.group(3) for m in (re.search(r"(\S+)/(\S+)\s+B spill st/ld  (.*)", l)
                                 for l in open(os.path.join(out, f"ptxas-table-{name}.txt")))
            if m and (m.group(1), m.group(2)) != ("0", "0")]
    except OSError:
        variants[name]["kernels_with_spills"] = ["no ptxas table"]
    summary[f"gemm_{name}"] = b.get("gemm", b)
for prefix, results in [("gemm", bench.get("gemm"))] + [(f"gemm_{n}", b.get("gemm")) for n, b in variant_bench.items()]:
    for g in results if isinstance(results, list) else []:
        if g.get("n") == 4096:
            key = "" if g.get("layout") == "Y=XW^T" else "_" + {"dX=dYW": "dX", "dW=dY^TX": "dW"}.get(g.get("layout"), "?")
            summary[f"{prefix}_{g['dtype']}_4096{key}_ratio"] = g.get("ratio")
def rows(name):
    try:
        import csv
        return list(csv.DictReader(open(os.path.join(out, name))))
    except Exception:
        return []
cpu_rows, cuda_rows = rows("train-cpu.csv"), rows("train-cuda.csv")
if cpu_rows and cuda_rows:
    skips = lambda r: [x["step"] for x in r if x["skipped"] == "1"]
    summary["train_demo"] = {"cpu_skips": skips(cpu_rows), "cuda_skips": skips(cuda_rows),
                             "cpu_final_loss": cpu_rows[-1]["loss"], "cuda_final_loss": cuda_rows[-1]["loss"],
                             "rows": [len(cpu_rows), len(cuda_rows)]}
for mode in ("async", "sync"):
    try:
        text = open(os.path.join(out, f"train-mlp-cuda-{mode}.out")).read()
        params = int(re.search(r"mlp (\d+) parameters", text).group(1))
        m = re.search(r"done: (\d+) steps .*? in ([0-9.e+-]+) s", text)
        steps, secs = int(m.group(1)), float(m.group(2))
        # fwd + bwd of the linear layers: 6 flops per parameter per sample.
        summary[f"train_mlp_cuda_{mode}"] = {"params": params, "steps": steps, "seconds": secs,
                                             "steps_per_sec": round(steps / secs, 2),
                                             "tflops": round(6.0 * params * 512 * steps / secs / 1e12, 2)}
    except Exception as e:
        summary[f"train_mlp_cuda_{mode}"] = {"error": str(e)}
for name in sorted(os.listdir(out)):
    m = re.fullmatch(r"nccl-((?:sharded-)?)(\d+)\.out", name)
    if not m:
        continue
    text = open(os.path.join(out, name)).read()
    d = re.search(r"done: (\d+) steps .* in ([0-9.e+-]+) s", text)
    sync = re.search(r"gradient sync ([0-9.e+-]+) s, of which waiting ([0-9.e+-]+) s", text)
    entry = {"ranks": int(m.group(2)), "sharded": bool(m.group(1)), "error": None if d else text.strip().splitlines()[-1:]}
    if d:
        entry.update(steps=int(d.group(1)), seconds=float(d.group(2)),
                     samples_per_sec=round(int(d.group(1)) * 512 / float(d.group(2)), 1))
    if sync:
        entry.update(sync_seconds=float(sync.group(1)), wait_seconds=float(sync.group(2)))
    try:
        entry["csv_equals_local"] = open(os.path.join(out, "nccl-local.csv")).read() == open(os.path.join(out, f"nccl-{m.group(1)}{m.group(2)}.csv")).read()
    except OSError:
        pass
    summary[f"nccl_{m.group(1).replace('-', '_')}np{m.group(2)}"] = entry
def gpt_seconds(dtype, steps):
    try:
        text = open(os.path.join(out, f"gpt-cuda-{dtype}-{steps}.out")).read()
        return float(re.search(r"done: %d steps .*? in ([0-9.e+-]+) s" % steps, text).group(1))
    except Exception:
        return None
torch_gpt = load("torch_gpt_step.json")
summary["gpt2_small_step"] = {"torch": torch_gpt}
for dtype in ("bf16", "fp16"):
    t10, t40 = gpt_seconds(dtype, 10), gpt_seconds(dtype, 40)
    if t10 is None or t40 is None or t40 <= t10:
        summary["gpt2_small_step"][dtype] = {"error": "belay gpt run failed", "seconds_10": t10, "seconds_40": t40}
        continue
    ms = (t40 - t10) / 30 * 1e3
    entry = {"belay_step_ms": round(ms, 3), "belay_tokens_per_s": round(4 * 1024 / ms * 1e3)}
    peer = [r for r in torch_gpt.get("runs", []) if r.get("dtype") == dtype]
    if peer:
        entry["torch_step_ms"] = peer[0]["step_ms"]
        entry["belay_over_torch_time"] = round(ms / peer[0]["step_ms"], 3)
    summary["gpt2_small_step"][dtype] = entry
a, b = summary.get("train_mlp_cuda_async", {}), summary.get("train_mlp_cuda_sync", {})
if a.get("seconds") and b.get("seconds"):
    summary["sync_each_step_over_async_time"] = round(b["seconds"] / a["seconds"], 3)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
# Each kernel's measured time beside what it should take at the H200's limits (flops and DRAM
# bytes counted by the SIMT emulator: bench/gpu/h200_expected.json): which kernel is far off.
stamp "expected at the H200's limits vs measured ($OUT/expected-vs-measured.txt)"
python3 "$ROOT/bench/gpu/expected_column.py" "$OUT" || echo "expected column: failed"
stamp "done"
