#!/usr/bin/env bash
# bench/gpu/expected_column.py (the "expected" column of bench/gpu-check.sh's report) on a made-up
# summary in the shape gpu-check.sh writes: each measured kernel beside its time at the H200's
# limits, the fraction of the limit reached, summary.json extended. No GPU needed.
#   usage: expected_column_test.sh REPO_ROOT
set -euo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "expected_column_test: $*"; exit 1; }

cp "$root/tests/bench/gpu-check-summary.json" "$dir/summary.json"
python3 "$root/bench/gpu/expected_column.py" "$dir" > "$dir/stdout" || fail "the script failed"
cat "$dir/stdout"
table="$dir/expected-vs-measured.txt"
[ -s "$table" ] || fail "no expected-vs-measured.txt"
# 2 * 4096^3 flops at 989 TFLOP/s = 0.1390 ms; measured 0.2 ms: 0.695 of the limit.
grep -qE '^gemm Y=XW\^T fp16 +4096\^3 +0\.2000 +0\.1390 +0\.695  tensor cores$' "$table" || fail "no fp16 4096 row"
grep -qE '^cuBLAS Y=XW\^T fp16 +4096\^3 +0\.1600 +0\.1390 +0\.869 ' "$table" || fail "no cuBLAS row"
grep -qE '^gemm \(warps 2x4\) Y=XW\^T fp16 +4096\^3 +0\.2780 ' "$table" || fail "no warps4 row (an older summary's key)"
grep -qE '^gemm \(bn256\) Y=XW\^T fp16 +4096\^3 +0\.2500 +0\.1390 +0\.556 ' "$table" || fail "no row of a gemm variant"
grep -qE '^gemm dW=dY\^TX fp16 +4096\^3 ' "$table" || fail "no dW row"
# 34 bytes a parameter (guard 4, AdamW 30) of 268.6 M at 4.8 TB/s: 1.903 ms.
grep -qE '^guard\+clip\+adamw\+scaler +269 M params +3\.8060 +1\.9030 +0\.500  HBM$' "$table" || fail "no step row"
grep -qE '^guard \(fused\) +269 M params +0\.4478 +0\.2239 ' "$table" || fail "no guard row"
! grep -q ' 512\^3 ' "$table" || fail "a shape without a limit got a row"
cmp -s "$table" "$dir/stdout" || fail "what it printed is not the table it wrote"
python3 - "$dir/summary.json" <<'PY' || fail "summary.json lacks the expected section"
import json, sys
s = json.load(open(sys.argv[1]))
rows = {(r["kernel"], r["shape"]): r for r in s["expected"]}
r = rows[("gemm Y=XW^T fp16", "4096^3")]
assert abs(r["expected_ms"] - 0.139) < 1e-9 and r["of_limit"] == 0.695, r
assert s["gemm"][0]["belay_ms"] == 0.2  # the rest of the summary is kept
PY
echo "expected_column_test: ok"
