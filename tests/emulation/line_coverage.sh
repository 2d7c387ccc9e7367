#!/usr/bin/env bash
# Line coverage of the GPU path on the emulated device: what a real GPU build runs, every
# file of kernels/cuda/ but the emulator (kernels/cuda/emulation/), and the NCCL communicator
# (amp/dist/nccl_communicator.cpp) when the build compiles it. Needs a build configured with
# -DBELAY_EMU_LINE_COVERAGE=ON (clang's source-based coverage), whose programs write
# <build>/profraw/%m-%p.profraw (one file per process: no clobbering; clear the folder
# before the tests run). Merges those files, prints
#   GPU path: N of M lines executed (P%)
# and writes every line not executed, as FILE:LINE: source, to <build>/gpu-path-uncovered.txt;
# docs/gpu-path-uncovered.md says why each kind of line is left. Exit 0 whatever the figure
# (the target, 95%, is a goal, not a gate), 1 when there is nothing to measure.
#   usage: line_coverage.sh BUILD [REPO_ROOT]
set -euo pipefail
build=$(cd "${1:?usage: line_coverage.sh BUILD [REPO_ROOT]}" && pwd)
root=$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
profdata=${LLVM_PROFDATA:-llvm-profdata-14}
cov=${LLVM_COV:-llvm-cov-14}
shopt -s nullglob
raw=("$build"/profraw/*.profraw)
((${#raw[@]})) || { echo "GPU path: no .profraw files in $build/profraw (BELAY_EMU_LINE_COVERAGE=ON and LLVM_PROFILE_FILE set for the tests?)"; exit 1; }
"$profdata" merge -sparse "${raw[@]}" -o "$build/gpu-path.profdata"

# Every instrumented executable of the build (those holding a coverage map) but the planted
# bugs' (a mutant's lines are not the GPU path's); the same function in several is counted once.
objects=()
while IFS= read -r bin; do
  case "$bin" in */planted_*) continue;; esac
  readelf -S --wide "$bin" 2>/dev/null | grep -q __llvm_covmap && objects+=(-object "$bin")
done < <(find "$build" -type f -perm -u+x ! -path '*/CMakeFiles/*' ! -name '*.so' | sort)
((${#objects[@]})) || { echo "GPU path: no executable with a coverage map in $build"; exit 1; }

# lcov's DA records: one per line that holds code, with its count.
"$cov" export -format=lcov -instr-profile "$build/gpu-path.profdata" "${objects[@]:1}" \
  > "$build/gpu-path.lcov"
python3 - "$build/gpu-path.lcov" "$root" "$build/gpu-path-uncovered.txt" <<'PY'
import os, sys
lcov, root, out = sys.argv[1], sys.argv[2], sys.argv[3]
def on_gpu_path(rel):
    return (rel.startswith("kernels/cuda/") and not rel.startswith("kernels/cuda/emulation/")) \
        or rel == "amp/dist/nccl_communicator.cpp"
lines = {}  # (file, line) -> executed (a line in several objects counts once, run if any ran it)
current = None
for rec in open(lcov):
    rec = rec.strip()
    if rec.startswith("SF:"):
        rel = os.path.relpath(os.path.realpath(rec[3:]), root)
        current = rel if on_gpu_path(rel) else None
    elif rec.startswith("DA:") and current:
        n, count = rec[3:].split(",")[:2]
        key = (current, int(n))
        lines[key] = lines.get(key, False) or int(count) > 0
if not lines:
    sys.exit("GPU path: no line of kernels/cuda/ in the coverage map")
missed = sorted(k for k, ran in lines.items() if not ran)
sources = {}
with open(out, "w") as f:
    for rel, n in missed:
        text = sources.setdefault(rel, open(os.path.join(root, rel)).read().split("\n"))
        f.write(f"{rel}:{n}: {text[n - 1].strip() if n <= len(text) else ''}\n")
files = sorted({rel for rel, _ in lines})
ran = len(lines) - len(missed)
print(f"GPU path: {ran} of {len(lines)} lines executed ({100.0 * ran / len(lines):.1f}%), "
      f"{len(files)} files; not executed: {out}")
if "amp/dist/nccl_communicator.cpp" not in files:
    print("GPU path: amp/dist/nccl_communicator.cpp is not compiled in this build (not counted)")
PY
