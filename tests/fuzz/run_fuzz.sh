#!/usr/bin/env bash
# Builds the safetensors libFuzzer target with clang (ASan + UBSan, CUDA off) in its own
# build directory and runs it for a bounded number of inputs from a seed corpus made here.
# Exit status 0: no crash found; otherwise libFuzzer's, with the crashing input saved in
# the build directory's fuzz-artifacts/.
#   usage: tests/fuzz/run_fuzz.sh [RUNS=200000] [SECONDS=60]
#   env:   BELAY_SAN_BUILD_DIR (default build-san, shared with tests/sanitize.sh: same flags,
#          so one clang build serves both), BELAY_FUZZ_JOBS (default: all cores)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BELAY_SAN_BUILD_DIR:-$root/build-san}
runs=${1:-200000}
seconds=${2:-60}
bash "$root/tests/configure_san.sh" "$root" "$build"
cmake --build "$build" -j"${BELAY_FUZZ_JOBS:-$(nproc)}" --target fuzz_safetensors write_sample_safetensors

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/seeds" "$build/fuzz-artifacts"
# Seeds: a file belay writes, and hand-made ones in the shapes other tools write.
"$build/tests/write_sample_safetensors" "$work/seeds/belay_sample.safetensors"
python3 - "$work/seeds" <<'PY'
import json, struct, sys
def save(name, header, data=b""):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack("<Q", len(text)) + text + data)
save("empty", {})
save("torch_like", {"__metadata__": {"format": "pt"},
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]},
                    "c": {"dtype": "I64", "shape": [1], "data_offsets": [12, 20]},
                    "d": {"dtype": "U8", "shape": [3], "data_offsets": [20, 23]}}, bytes(range(23)))
save("scalar_and_empty", {"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]},
                          "z": {"dtype": "F32", "shape": [0, 5], "data_offsets": [2, 2]}}, b"\x00\x3c")
PY

"$build/tests/fuzz/fuzz_safetensors" -runs="$runs" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -dict="$root/tests/fuzz/safetensors.dict" -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1 \
  "$work/corpus" "$work/seeds"
echo "run_fuzz: no crash in the bounded run (runs=$runs, max_total_time=${seconds}s)"
