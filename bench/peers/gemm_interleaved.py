#!/usr/bin/env python3
"""belay's FP32 matrix product beside PyTorch's (MKL on x86) in ONE process, alternately: GPT-2
small's (or with --model default, belay train's default GPT's) forward and dX products at 1024
tokens, each ratio taken with the machine's drift out.

    OMP_NUM_THREADS=N gemm_interleaved.py [--threads N] [--rounds R] [--model M] --json FILE.json
    (writes FILE.json and FILE.md, the table)

Each round times a block of `--block` calls of belay's product, then of PyTorch's (the order
swapped every round, each block after one untimed call); a shape's ratio is the median over
the rounds of belay's mean call over PyTorch's; beside it each library's fastest call over all
rounds (the speed each reaches with the machine and its caches at their best). belay:
belay.linear(x, W) for the forward (x W^T, the weight as stored, [out, in]) and
belay.matmul(dY, W) for dX, under belay.no_grad,
its inputs belay Tensors made once; PyTorch: F.linear(x, W) and torch.mm(dY, W) under
torch.no_grad. Both write a fresh output each call, from their caching allocators. The dW
products are left out: belay's Python ops have no transposed view of dY to hand its GEMM.
Clock: the thread's CPU time at 1 thread, wall time above. Check: the two products agree to
1e-4 relative (FP32 sums in different orders). Set-up as gpt_interleaved.py's (the belay
Python module in the PyTorch venv), never CI.
"""
import argparse
import os
import statistics
import sys

import numpy as np
import torch  # before belay: belay's NCCL loaded first breaks `import torch`
import torch.nn.functional as F

import belay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cpu  # noqa: E402  (require, CheckFailure)
from gpt_interleaved import interleave, provenance, ratio_stats, set_threads, write_results  # noqa: E402
from torch_cpu import require  # noqa: E402

TOKENS = 1024


def model_shapes(width, vocab):
    """(layer, product, M, N, K) of a GPT's Linears of this width at 1024 tokens, forward (x [M, K]
    by W^T, W [N, K]) and dX (dY [M, K] by W [K, N]); the tied head where it is small enough to
    time in rounds."""
    rows = [("attn.qkv", 3 * width, width), ("attn.proj", width, width), ("mlp.fc", 4 * width, width),
            ("mlp.proj", width, 4 * width)] + ([("head", vocab, width)] if vocab <= 4096 else [])
    return [s for layer, n, k in rows
            for s in ((layer, "forward", TOKENS, n, k), (layer, "dX", TOKENS, k, n))]


# GPT-2 small's and belay train's default GPT's (width 128, vocab 256): bench/gpt.cpp's models.
MODEL_SHAPES = {"gpt2-small": model_shapes(768, 50304), "default": model_shapes(128, 256)}


def run_shape(layer, product, m, n, k, rounds, block, clock):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k) if product == "forward" else (k, n), dtype=np.float32) * 0.02
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    ba, bw = belay.Var(belay.from_numpy(a, None)), belay.Var(belay.from_numpy(w, None))

    def belay_call():
        with belay.no_grad():
            return belay.linear(ba, bw, None) if product == "forward" else belay.matmul(ba, bw)

    def torch_call():
        with torch.no_grad():
            return F.linear(ta, tw) if product == "forward" else torch.mm(ta, tw)

    got, want = belay_call().numpy(), torch_call().numpy()
    require(np.allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())),
            f"{layer} {product}: belay's product is not PyTorch's")
    times, means = interleave({"belay": belay_call, "torch": torch_call}, rounds, block, clock)
    flops = 2.0 * m * n * k
    return {"layer": layer, "product": product, "m": m, "n": n, "k": k, "rounds": rounds, "block": block,
            "belay_gflops": flops / (statistics.median(means["belay"]) * 1e6),
            "torch_gflops": flops / (statistics.median(means["torch"]) * 1e6), **ratio_stats(means),
            "belay_best_gflops": flops / (min(times["belay"]) * 1e6),
            "torch_best_gflops": flops / (min(times["torch"]) * 1e6),
            "best_ratio": min(times["belay"]) / min(times["torch"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--model", choices=sorted(MODEL_SHAPES), default="gpt2-small")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    clock = set_threads(a.threads)
    rows = []
    for shape in MODEL_SHAPES[a.model]:
        row = run_shape(*shape, a.rounds, a.block, clock)
        print(f"{row['layer']:9} {row['product']:7} {row['m']:5} x {row['n']:5} x {row['k']:5}: belay "
              f"{row['belay_gflops']:6.1f} GFLOP/s, PyTorch {row['torch_gflops']:6.1f}; belay / PyTorch time "
              f"{row['ratio_median']:.3f} (quartiles {row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}); best calls "
              f"{row['belay_best_gflops']:.1f} / {row['torch_best_gflops']:.1f} GFLOP/s, {row['best_ratio']:.3f}",
              flush=True)
        rows.append(row)
    write_results(a.json, a.threads, rows, table)


def table(out):
    """The rows as a markdown table."""
    lines = [f"# belay's FP32 GEMM beside PyTorch's, interleaved in one process ({out['threads']} thread(s))", "",
             provenance(out) + " GFLOP/s: of the median block mean. Ratio: the median over the rounds of belay's mean call over "
             "PyTorch's in the same round (its quartiles beside it). Best calls: each library's fastest call over all "
             "rounds, and the ratio of the two (what each reaches when the machine and its caches are at their best).", "",
             "| layer | product | M x N x K | belay GFLOP/s | PyTorch GFLOP/s | belay / PyTorch time | quartiles "
             "| best calls, GFLOP/s | best-call ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['layer']} | {r['product']} | {r['m']} x {r['n']} x {r['k']} | {r['belay_gflops']:.1f} | "
                     f"{r['torch_gflops']:.1f} | **{r['ratio_median']:.3f}** | {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f} | "
                     f"{r['belay_best_gflops']:.1f} / {r['torch_best_gflops']:.1f} | {r['best_ratio']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    except torch_cpu.CheckFailure as e:
        sys.exit(f"gemm_interleaved: {e}")
