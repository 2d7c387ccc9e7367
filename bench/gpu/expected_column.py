#!/usr/bin/env python3
"""The "expected" column of bench/gpu-check.sh's report: each benchmarked kernel's measured time
beside the time it should take at the H200's limits (bench/gpu/h200_expected.json, written from
the SIMT emulator's counts of flops and DRAM bytes by tests/emulation/test_memory_metrics.cpp).

    expected_column.py OUT_DIR [EXPECTED_JSON]

Reads OUT_DIR/summary.json (gpu-check.sh's summary), writes OUT_DIR/expected-vs-measured.txt,
adds an "expected" section to summary.json, and prints the table. "of limit" is expected /
measured: 1.0 is a kernel at the machine's limit, 0.2 one five times slower than it could be.
"""
import json
import os
import sys


def rows(summary, expected):
    """(kernel, shape, measured_ms, expected_ms, bound) for each measurement that has a limit."""
    limits = {(g["layout"], g["dtype"], g["n"]): g for g in expected.get("gemm", [])}
    out = []
    # The default GEMM, then each variant gpu-check.sh built (summary["gemm_variants"]), and
    # the 8-warp grid under its old key in summaries written before the variants were.
    variants = summary.get("gemm_variants") if isinstance(summary.get("gemm_variants"), dict) else {}
    keys = [("gemm", "gemm")] + [(f"gemm_{name}", f"gemm ({name})") for name in variants]
    if "gemm_warps4" in summary and "warps4" not in variants:
        keys.append(("gemm_warps4", "gemm (warps 2x4)"))
    for key, label in keys:
        results = summary.get(key)
        for g in results if isinstance(results, list) else []:
            limit = limits.get((g.get("layout"), g.get("dtype"), g.get("n")))
            if limit is None:
                continue
            shape = f"{g['n']}^3"
            out.append((f"{label} {g['layout']} {g['dtype']}", shape, g.get("belay_ms"), limit["expected_ms"],
                        limit["bound"]))
            if key == "gemm":
                out.append((f"cuBLAS {g['layout']} {g['dtype']}", shape, g.get("cublas_ms"), limit["expected_ms"],
                            limit["bound"]))
    step, limit = summary.get("step"), expected.get("step")
    if isinstance(step, dict) and limit:
        shape = f"{limit['params'] / 1e6:.0f} M params"
        out.append(("guard (fused)", shape, step.get("guard_ms"), limit["guard_expected_ms"], limit["bound"]))
        out.append(("guard+clip+adamw+scaler", shape, step.get("step_ms"), limit["step_expected_ms"], limit["bound"]))
    return out


def table(entries):
    lines = [f"{'kernel':<34} {'shape':<16} {'measured ms':>12} {'expected ms':>12} {'of limit':>9}  bound"]
    for kernel, shape, measured, expected_ms, bound in entries:
        ok = isinstance(measured, (int, float)) and measured > 0
        m = f"{measured:.4f}" if ok else "-"
        frac = f"{expected_ms / measured:.3f}" if ok else "-"
        lines.append(f"{kernel:<34} {shape:<16} {m:>12} {expected_ms:>12.4f} {frac:>9}  {bound}")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    expected_path = sys.argv[2] if len(sys.argv) == 3 else os.path.join(here, "h200_expected.json")
    with open(expected_path) as f:
        expected = json.load(f)
    summary_path = os.path.join(out, "summary.json")
    with open(summary_path) as f:
        summary = json.load(f)
    entries = rows(summary, expected)
    text = ("# measured on this GPU beside the time at the H200's limits (" + expected["source"] + "),\n"
            "# from the emulator's counts of flops and DRAM bytes (bench/gpu/h200_expected.json)\n" + table(entries))
    with open(os.path.join(out, "expected-vs-measured.txt"), "w") as f:
        f.write(text)
    summary["expected"] = [{"kernel": k, "shape": s, "measured_ms": m, "expected_ms": e, "bound": b,
                            "of_limit": round(e / m, 4) if isinstance(m, (int, float)) and m > 0 else None}
                           for k, s, m, e, b in entries]
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
