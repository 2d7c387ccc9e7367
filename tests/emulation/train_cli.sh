#!/usr/bin/env bash
# `belay train --device cuda` end to end on the emulated device: fp16 with loss scaling, two
# micro-batches, clipping and planted infs, as a user runs it. The CSV must have every step,
# skip the planted steps as the CPU run does, and stay within tolerance of the CPU's losses.
#   usage: train_cli.sh BELAY_BINARY
set -euo pipefail
belay=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--model mlp --in 32 --hidden 64 --out 8 --batch 32 --micro-batch 16 --steps 60 --dtype fp16
      --clip 1.0 --inject-inf 10 --inject-inf 40 --seed 3)
"$belay" train "${args[@]}" --device cuda --csv "$dir/cuda.csv" >"$dir/cuda.out"
"$belay" train "${args[@]}" --device cpu --csv "$dir/cpu.csv" >"$dir/cpu.out"
python3 - "$dir/cuda.csv" "$dir/cpu.csv" <<'PY'
import csv, math, sys
g = list(csv.DictReader(open(sys.argv[1])))
c = list(csv.DictReader(open(sys.argv[2])))
assert len(g) == 60 and len(c) == 60, (len(g), len(c))
for a, b in zip(g, c):
    assert a["skipped"] == b["skipped"] and a["skip_reason"] == b["skip_reason"], (a, b)
    assert a["scaler_scale"] == b["scaler_scale"], (a, b)
    la, lb = float(a["loss"]), float(b["loss"])
    if math.isfinite(lb):
        assert abs(la - lb) <= 2e-2 * max(1.0, abs(lb)), (a["step"], la, lb)
skips = [r["step"] for r in g if r["skipped"] == "1"]
print(f"train_cli: 60 steps on the emulated GPU, skipped {skips} as on the CPU, losses within 2e-2")
PY
