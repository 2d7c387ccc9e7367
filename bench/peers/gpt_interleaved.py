#!/usr/bin/env python3
"""belay's GPT step and PyTorch's in ONE process, one step of each in turn: the ratio of
belay's time to PyTorch's with the machine's drift taken out.

    gpt_interleaved.py [--threads N] [--rounds R] [--rows default,gpt2,gpt2-1024] [--dtypes fp32,bf16]
                       --json FILE.json
    (writes FILE.json, every round's times, and FILE.md, the table)

Why: bench/gpt_vs_torch.sh runs belay_bench and torch_gpt.py one after the other, minutes
apart. On a shared KVM guest whose clock moves by a third within the hour (the AMX Xeon of
2026-12-06: its FMA peak loop read 107-176 GFLOP/s) two sittings of that script gave the same
row 0.72 and 0.96. Here each round runs a block of steps of one library, then a block of the
other (the order swapped every round), so both see the same minute of the machine; a row's
ratio is the median over the rounds of belay's mean step time over PyTorch's in that round.
A block starts with one untimed step: the step before it was the other library's, and a step
that follows one of its own finds its weights and buffers in the caches (GPT-2 small's step
touches ~2 GB; this Xeon's L3 is 300 MiB). Alternating single steps measured belay's GPT-2
small fp32 step at 1.06-1.16x PyTorch's where the two alone, minutes apart, read 0.94: each
library then ran on the other's leftovers, and the libraries do not suffer alike.

The steps are those of bench/gpt.cpp's GptStep and bench/peers/torch_gpt.py's step_row: the
default GPT of `belay train --model gpt` (2 layers, width 128, 4 heads, context 64, vocab 256,
head tied) at batch 16 and 32, and GPT-2 small (12 layers, width 768, 12 heads, vocab 50304)
at batch 4 x 256; fp32, and bf16 under autocast; one fixed batch of random tokens; belay:
SafeStep (guard, clip at 1.0, AdamW with weight decay 0.01 on every parameter, as PyTorch's);
PyTorch: zero_grad, cross_entropy, backward, clip_grad_norm_(1.0), AdamW (fused where this
PyTorch has it), the SDPA attention (F.scaled_dot_product_attention, its fused kernel).

Clock: one thread, each library's CPU time of this thread (time.thread_time: both run their
one thread on the caller's); more threads, wall time. Threads: OMP_NUM_THREADS for belay's
OpenMP and torch.set_num_threads for PyTorch's (each library brings its own OpenMP runtime;
between the steps the other's threads sleep after their spin). Checks: every loss finite and,
for each library, some step's loss below its first.

Needs the belay Python module and torch in one environment (never CI), torch imported first:
  python -m venv V && V/bin/pip install torch numpy scikit-build-core pybind11 ml_dtypes
  cmake --install build --prefix P
  V/bin/pip install --no-build-isolation -Ccmake.define.belay_DIR=P/lib/cmake/belay apps/python
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch  # before belay: belay's NCCL loaded first breaks `import torch`
import torch.nn.functional as F

import belay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cpu  # noqa: E402  (make_adamw: fused AdamW where this PyTorch has it; require)
from torch_cpu import require  # noqa: E402
import torch_gpt  # noqa: E402  (the PyTorch GPT of the gpt rows)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The rows: (model, batch, context or None for the model's own) per group, and each group's timed
# steps per block (after one untimed). gpt2-1024: GPT-2 small at its own context, 4 x 1024 (both
# libraries hold ~5 GB each there).
ROWS = {"default": [("default", 16, None), ("default", 32, None)], "gpt2": [("gpt2-small", 4, None)],
        "gpt2-1024": [("gpt2-small", 4, 1024)]}
BLOCK = {"default": 5, "gpt2": 2, "gpt2-1024": 1}


class BelayStep:
    """bench/gpt.cpp's GptStep through the Python module."""

    def __init__(self, shape, batch, dtype, ids, labels):
        self.model = belay.Gpt(seed=42, **shape)
        if dtype != "fp32":
            self.model.set_working_dtype(dtype)
        self.model.set_grad_dtype("fp32")
        opt = belay.AdamW(self.model, lr=1e-3, weight_decay=0.01, decay_1d=True)
        self.step = belay.SafeStep(opt, belay.GradScaler(enabled=False), max_norm=1.0)
        self.dtype, self.ids, self.labels = dtype, ids.numpy(), labels.numpy()
        self.losses = []

    def loss(self, _k):
        if self.dtype == "fp32":
            return belay.cross_entropy(self.model(self.ids), self.labels)
        with belay.autocast(self.dtype):
            return belay.cross_entropy(self.model(self.ids), self.labels)

    def __call__(self):
        self.losses.append(self.step.run(self.loss).loss)


class TorchStep:
    """torch_gpt.py's step_row, the SDPA model."""

    def __init__(self, shape, batch, dtype, ids, labels):
        torch.manual_seed(42)
        self.model = torch_gpt.Gpt(attn="sdpa", **shape)
        self.opt, self.impl = torch_cpu.make_adamw(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.params = list(self.model.parameters())
        self.dtype, self.ids, self.labels = dtype, ids, labels
        self.losses = []

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=DTYPES[self.dtype], enabled=self.dtype != "fp32"):
            loss = F.cross_entropy(self.model(self.ids), self.labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.losses.append(loss.item())


def timed(fn, clock):
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def run_row(model_name, batch, context, dtype, rounds, block, clock):
    shape = dict(torch_gpt.MODELS[model_name], **({"context": context} if context else {}))
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, shape["vocab"], (batch, shape["context"]), generator=g)
    labels = torch.randint(0, shape["vocab"], (batch * shape["context"],), generator=g)
    sides = {"belay": BelayStep(shape, batch, dtype, ids, labels), "torch": TorchStep(shape, batch, dtype, ids, labels)}
    for step in sides.values():  # warm-up: the first steps allocate and touch every buffer
        step()
    times, means = interleave(sides, rounds, block, clock)
    what = f"{model_name} batch {batch} {dtype}"
    for side, step in sides.items():
        require(all(math.isfinite(v) for v in step.losses), f"{what}: a non-finite loss ({side})")
        # Some later step below the first: GPT-2 small's first Adam steps at lr 1e-3 can raise it.
        require(min(step.losses[1:]) < step.losses[0], f"{what}: {side}'s loss did not go down")
    return {"model": model_name, "batch": batch, "context": shape["context"], "dtype": dtype, "rounds": rounds,
            "block": block, "belay_ms": statistics.median(times["belay"]), "torch_ms": statistics.median(times["torch"]),
            **ratio_stats(means), "torch_optimizer": sides["torch"].impl, "belay_times_ms": times["belay"],
            "torch_times_ms": times["torch"]}


def interleave(sides, rounds, block, clock):
    """Rounds of a block of `block` timed calls of each side in turn ({"belay": fn, "torch": fn};
    the order swapped every round), each block after one untimed call: the other side's block
    ran just before. Returns each side's call times and block means, in ms."""
    times = {side: [] for side in sides}
    means = {side: [] for side in sides}
    names = list(sides)
    for r in range(rounds):
        for side in (names if r % 2 == 0 else names[::-1]):
            sides[side]()
            block_times = [timed(sides[side], clock) for _ in range(block)]
            times[side] += block_times
            means[side].append(statistics.fmean(block_times))
    return times, means


def ratio_stats(means):
    """belay's block mean over PyTorch's in each round: the median and its quartiles."""
    ratios = [b / t for b, t in zip(means["belay"], means["torch"])]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return {"ratio_median": statistics.median(ratios), "ratio_q1": q[0], "ratio_q3": q[2]}


def machine():
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15,
                    help="rounds of the default rows (a block of 5 timed steps each); GPT-2 small: a third, at least 3 "
                         "(2 steps each; 1 at context 1024)")
    ap.add_argument("--rows", default="default,gpt2", help="row groups: default, gpt2, gpt2-1024")
    ap.add_argument("--dtypes", default="fp32,bf16",
                    help="fp32, bf16 or both (without AVX512-BF16 PyTorch's bf16 matmul is a reference kernel: "
                         "GPT-2 small's bf16 step takes it minutes)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    dtypes = a.dtypes.split(",")
    require(all(d in ("fp32", "bf16") for d in dtypes), f"--dtypes: fp32 and/or bf16, not {a.dtypes!r}")
    clock = set_threads(a.threads)
    rows = []
    for group in a.rows.split(","):
        require(group in ROWS, f"unknown row group {group!r} ({', '.join(ROWS)})")
        for model_name, batch, context in ROWS[group]:
            rounds = a.rounds if group == "default" else max(3, a.rounds // 3)
            for dtype in dtypes:
                row = run_row(model_name, batch, context, dtype, rounds, BLOCK[group], clock)
                print(f"{model_name:10} batch {batch:2} {dtype}: belay {row['belay_ms']:9.1f} ms  torch "
                      f"{row['torch_ms']:9.1f} ms  belay/torch {row['ratio_median']:.3f} "
                      f"(quartiles {row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}, {rounds} rounds of {BLOCK[group]})",
                      flush=True)
                rows.append(row)
    write_results(a.json, a.threads, rows, table)


def set_threads(threads):
    """Both libraries on `threads` threads; returns the clock to time them by (the thread's CPU
    time at one thread, where both run on the caller's; wall time above)."""
    require(os.environ.get("OMP_NUM_THREADS") == str(threads),
            f"set OMP_NUM_THREADS={threads} for belay (read when its OpenMP starts)")
    torch.set_num_threads(threads)
    return time.thread_time if threads == 1 else time.perf_counter


def write_results(path, threads, rows, make_table):
    """PATH.json: the rows with the machine, the libraries and the command; PATH.md: make_table's."""
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out = {"machine": machine(), "threads": threads, "clock": "thread_cpu" if threads == 1 else "wall",
           "torch_version": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "belay_version": belay.__version__, "belay_commit": commit,
           "command": os.path.basename(sys.argv[0]) + " " + " ".join(sys.argv[1:]), "rows": rows}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    if path.endswith(".json"):
        with open(path[:-5] + ".md", "w") as f:
            f.write(make_table(out))


def provenance(out):
    """The sentence a results table opens with: the machine, the clock, both libraries, the command."""
    return (f"Machine: {out['machine']}. Clock: {out['clock']}. PyTorch {out['torch_version']} "
            f"({out['torch_cpu_capability']}), belay {out['belay_version']} at {out['belay_commit']}. "
            f"Command: `{out['command']}`.")


def table(out):
    """The rows as a markdown table: each side's median time and the median per-round ratio."""
    lines = [f"# belay's GPT step beside PyTorch's, interleaved in one process ({out['threads']} thread(s))", "",
             provenance(out) + " Times: the median step. Ratio: the median over the rounds of "
             "belay's mean step over PyTorch's in the same round (its quartiles beside it); a round is a "
             "block of each library's steps, each block after one untimed step.", "",
             "| model | batch x context | dtype | rounds x steps | belay ms | PyTorch ms | belay / PyTorch | quartiles |",
             "|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['model']} | {r['batch']} x {r['context']} | {r['dtype']} | {r['rounds']} x {r['block']} | "
                     f"{r['belay_ms']:.1f} | {r['torch_ms']:.1f} | **{r['ratio_median']:.3f}** | "
                     f"{r['ratio_q1']:.3f}-{r['ratio_q3']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    except torch_cpu.CheckFailure as e:
        sys.exit(f"gpt_interleaved: {e}")
