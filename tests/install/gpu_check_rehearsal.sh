#!/usr/bin/env bash
# bench/gpu-check.sh's configure, rehearsed on a CPU machine as the lent GPU machine will see
# it: none of Debian's -dev packages (the system's copies hidden from CMake with
# CMAKE_IGNORE_PREFIX_PATH, MPI switched off), only the folder third_party/vendor_gpu_deps.sh
# gathers. Checks, in ~15 s (no compile: the real compile commands run with -M):
#   1. without that folder the configure fails (so the hiding hides);
#   2. with it, gpu-check.sh's own configure line (CUDA on, sm_90) succeeds and finds Eigen,
#      CLI11, nlohmann-json and Catch2 there;
#   3. a source of each kind that includes them (the core's Eigen and JSON users, the CLI, a
#      GPU test) resolves every one of their headers to that folder, with its real flags;
#   4. belay_gpu_tests links that folder's libCatch2WithMain.a, not the system's.
#   usage: gpu_check_rehearsal.sh WORK_DIR        exit 77 (skip) without nvcc
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work=${1:?usage: gpu_check_rehearsal.sh WORK_DIR}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "CTEST_SKIP: no nvcc here: the GPU check's configure (CUDA on) cannot be rehearsed"; exit 77; }
export PATH="$PATH:/usr/local/cuda/bin"
fail() { echo "gpu_check_rehearsal: FAIL: $*" >&2; exit 1; }
mkdir -p "$work"
vendored="$work/vendored"
bash "$root/third_party/vendor_gpu_deps.sh" "$vendored"
# As on the lent machine: nothing under /usr or / (merged /usr: /lib/cmake is /usr/lib/cmake)
# is searched, and there is no MPI. The compilers' own include paths stay: the -M check below
# shows which copy of each header wins.
hide=("-DCMAKE_IGNORE_PREFIX_PATH=/usr;/" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)

rm -rf "$work/hidden" "$work/build"
if bash "$root/bench/gpu-check.sh" --configure-only "$work/hidden" "${hide[@]}" -DBELAY_DEPS_PREFIX= \
     > "$work/hidden.log" 2>&1; then
  fail "configured with the system's packages hidden and no vendored folder: the hiding hides nothing"
fi
grep -q 'Could not find a package configuration file provided by "Eigen3"' "$work/hidden.log" ||
  { tail -20 "$work/hidden.log"; fail "the hidden configure failed, but not for want of Eigen3"; }

bash "$root/bench/gpu-check.sh" --configure-only "$work/build" "${hide[@]}" -DBELAY_DEPS_PREFIX="$vendored/usr" \
  > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "gpu-check.sh's configure failed with $vendored"; }
grep -q 'belay: CUDA backend ON (emulated: OFF)' "$work/build.log" || fail "CUDA is not on in the rehearsed configure"
for pkg in Eigen3 CLI11 nlohmann_json Catch2; do
  dir=$(sed -n "s/^${pkg}_DIR:PATH=//p" "$work/build/CMakeCache.txt")
  case "$dir" in "$vendored"/*) ;; *) fail "$pkg found at '$dir', not in $vendored";; esac
done

# Each source's compile command as CMake wrote it, with -M instead of -c -o: the headers it reads.
python3 - "$work/build/compile_commands.json" "$vendored/usr" "$root" <<'PY'
import json, shlex, subprocess, sys
db, vendored, root = sys.argv[1], sys.argv[2], sys.argv[3]
wanted = {  # source -> the vendored include folders it must read
    "engine/safetensors.cpp": ["nlohmann"],
    "kernels/cpu/isa/gemm_f32.cpp": ["eigen3"],
    "tests/apps/cli/test_train_options.cpp": ["CLI"],  # apps/cli/ compiles its CLI11 users as one unit
    "tests/gpu/test_cuda_transfers.cpp": ["catch2"],
}
seen = {}
for entry in json.load(open(db)):
    rel = entry["file"][len(root) + 1:]
    if rel not in wanted or rel in seen:
        continue
    args, out = shlex.split(entry["command"]), []
    skip = False
    for a in args:
        if skip: skip = False; continue
        if a in ("-o", "-MF", "-MT", "-MQ"): skip = True; continue
        if a in ("-c", "-MD", "-MMD"): continue
        out.append(a)
    deps = subprocess.run(out + ["-M"], cwd=entry["directory"], capture_output=True, text=True, check=True).stdout
    deps = deps.replace("\\\n", " ").split()
    for lib in wanted[rel]:
        mine = [d for d in deps if d.startswith(f"{vendored}/include/{lib}/")]
        system = [d for d in deps if d.startswith(f"/usr/include/{lib}/")]
        if not mine or system:
            sys.exit(f"gpu_check_rehearsal: FAIL: {rel}: {len(mine)} {lib} headers from {vendored}, "
                     f"{len(system)} from /usr/include (e.g. {(system or ['-'])[0]})")
        print(f"{rel}: {len(mine)} {lib} headers, all from the vendored folder")
    seen[rel] = True
missing = sorted(set(wanted) - set(seen))
if missing:
    sys.exit(f"gpu_check_rehearsal: FAIL: no compile command for {missing}")
PY

link=$(grep -A3 '^build tests/belay_gpu_tests ' "$work/build/build.ninja" || true)
[ -n "$link" ] || fail "no link rule for belay_gpu_tests in the rehearsed build"
grep -q "$vendored/usr/lib/libCatch2WithMain.a" <<< "$link" || fail "belay_gpu_tests does not link $vendored's libCatch2WithMain.a"
! grep -q " /usr/lib/libCatch2WithMain.a" <<< "$link" || fail "belay_gpu_tests links the system's libCatch2WithMain.a"
echo "gpu_check_rehearsal: the GPU check configures (CUDA on, sm_90) from $vendored alone; 4 sources read its headers"
