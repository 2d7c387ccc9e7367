#!/usr/bin/env bash
# `belay train --model gpt --device cuda` end to end on the emulated device, at a tiny shape:
# fp16 (loss scaling, a planted inf, two micro-batches), on a small tokens file of Python-like
# text made here. (Only fp16, the dtype with the most belts, to keep CI short: each emulated
# step costs about a second under the sanitizers; the bf16 kernels run in tests/gpu.) Every step must be in the CSV, skipped where the CPU run skips
# with the same scale, each loss within 2e-2 of the CPU's (the bound of train_cli.sh: the
# two devices' kernels sum in different orders, and bf16/fp16 round those sums), and the
# held-out losses likewise; the census (--census --census-casts) has the CPU's rows.
#   usage: train_gpt_cli.sh BELAY_BINARY SOURCE_DIR
set -euo pipefail
belay=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$src/apps/data" "$dir/text.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from make_text_corpus import write_safetensors
def text(lines, salt):
    return "".join(f"def f{(i * 7 + salt) % 13}(x):\n    return x + {i % 5}\n" for i in range(lines)).encode()
write_safetensors(sys.argv[2], [("train", text(60, 0)), ("heldout", text(8, 3))],
                  {"tokens.format": "belay.tokens.v1", "tokens.vocab": "256"})
PY
for dtype in fp16; do
  args=(--model gpt --data "$dir/text.safetensors" --layers 1 --width 16 --heads 2 --context 8 --batch 4
        --micro-batch 2 --steps 4 --eval-every 2 --eval-windows 2 --dtype "$dtype" --inject-inf 1 --seed 3)
  "$belay" train "${args[@]}" --device cuda --csv "$dir/cuda.csv" --census "$dir/cuda_census.csv" --census-casts \
    >"$dir/cuda.out"
  "$belay" train "${args[@]}" --device cpu --csv "$dir/cpu.csv" --census "$dir/cpu_census.csv" --census-casts \
    >"$dir/cpu.out"
  python3 - "$dir/cuda.csv" "$dir/cpu.csv" "$dtype" "$dir/cuda_census.csv" "$dir/cpu_census.csv" <<'PY'
import csv, math, sys
g = list(csv.DictReader(open(sys.argv[1])))
c = list(csv.DictReader(open(sys.argv[2])))
# The census (the guard's and the casts', counted by the CUDA kernels): the same rows as the
# CPU's, the same sizes, the planted inf in the same tensor, the skipped step named alike.
gc = list(csv.DictReader(open(sys.argv[4])))
cc = list(csv.DictReader(open(sys.argv[5])))
assert [(r["step"], r["tensor"], r["numel"]) for r in gc] == [(r["step"], r["tensor"], r["numel"]) for r in cc]
assert any(r["tensor"].startswith("cast:") for r in gc), "no cast rows"
for a, b in zip(gc, cc):
    assert (a["nonfinite"] == "0") == (b["nonfinite"] == "0"), (a, b)
assert [r["nonfinite_tensors"] for r in g] == [r["nonfinite_tensors"] for r in c], "nonfinite_tensors"
assert len(g) == 4 and len(c) == 4, (len(g), len(c))
for a, b in zip(g, c):
    assert a["skipped"] == b["skipped"] and a["skip_reason"] == b["skip_reason"], (a, b)
    assert a["scaler_scale"] == b["scaler_scale"], (a, b)
    for col in ("loss", "heldout_loss"):
        if b[col] == "" or not math.isfinite(float(b[col])):
            assert a[col] == b[col], (a, b)
            continue
        la, lb = float(a[col]), float(b[col])
        assert abs(la - lb) <= 2e-2 * max(1.0, abs(lb)), (a["step"], col, la, lb)
assert g[1]["skipped"] == "1", g[1]
print(f"train_gpt_cli {sys.argv[3]}: 4 GPT steps on the emulated GPU, skipped step 1 as on the CPU, "
      f"losses and held-out losses within 2e-2, {len(gc)} census rows as the CPU's")
PY
done
