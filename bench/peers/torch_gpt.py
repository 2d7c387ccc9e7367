#!/usr/bin/env python3
"""PyTorch on the CPU as the peer of belay_bench's `gpt` section (bench/gpt.cpp): the same
block and the same training step, the same shapes, repetitions and statistics.

    torch_gpt.py [--quick] [--long] [--threads N] [--cpu-time] --json FILE

  block  one pre-LN GPT block (separate q, k, v Linears, erf GELU, causal softmax, LayerNorm
         eps 1e-5): forward, then (y * dy).sum().backward() (dx and every gradient), fp32
         and bf16 under autocast. Attention twice: `explicit`, the ops belay runs
         (scores = q k^T / sqrt(d), masked_fill, softmax, @ v), and `sdpa`,
         F.scaled_dot_product_attention(is_causal=True), PyTorch's fused kernel.
  step   the default GPT of `belay train --model gpt` (2 layers, width 128, 4 heads,
         context 64, vocab 256, head tied to wte) at batch 16 and 32, and (not with --quick;
         SDPA only) GPT-2 small (12 layers, width 768, 12 heads, vocab 50304) at batch 4 x 256
         and (--long) at batch 4 x 1024:
         zero_grad, autocast,
         cross_entropy, backward, clip_grad_norm_(1.0), AdamW (torch's defaults: lr 1e-3,
         weight decay 0.01; fused=True where this PyTorch has it, as bench/peers/torch_cpu.py),
         loss.item() every step, one fixed batch of random tokens.

Timing and checks as torch_cpu.py (its harness is imported): the block's loss finite and the
same at every repetition, dx finite; the step's losses finite and falling. Runs in the venv of
bench/peers/setup_torch_venv.sh, never in CI; bench/gpt_vs_torch.sh runs it beside belay.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cpu  # noqa: E402  (the harness: time_it, require, CLOCK, make_adamw)
from torch_cpu import require, time_it  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BLOCKS = [("gpt-default", 16, 64, 128, 4), ("gpt2-small", 1, 128, 768, 12)]
# The step's models, as bench/gpt.cpp's StepModel: belay train's default GPT, and GPT-2 small.
MODELS = {"default": dict(vocab=256, context=64, width=128, layers=2, heads=4),
          "gpt2-small": dict(vocab=50304, context=256, width=768, layers=12, heads=12)}
QUICK_BLOCKS = [("gpt-default", 4, 32, 64, 4)]


class Block(nn.Module):
    def __init__(self, width, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def attention(self, h, b, t):
        d = h.shape[1] // self.heads
        q, k, v = (p(h).view(b, t, self.heads, d).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b * t, h.shape[1]))

    def forward(self, x, b, t):
        x = x + self.attention(self.ln_1(x), b, t)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab=256, context=64, width=128, layers=2, heads=4, attn="explicit"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as belay's Gpt
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        b, t = ids.shape
        x = (self.wte(ids) + self.wpe(torch.arange(t))).view(b * t, -1)
        for block in self.blocks:
            x = block(x, b, t)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


def block_row(shape, dtype_name, attn, warmup, reps):
    name, b, t, width, heads = shape
    torch.manual_seed(7)
    block = Block(width, heads, attn)
    x = torch.randn(b * t, width)
    dy = torch.randn(b * t, width)
    losses, held = [], {}

    def body():
        block.zero_grad(set_to_none=True)
        xv = x.detach().requires_grad_(True)
        with torch.autocast("cpu", dtype=DTYPES[dtype_name], enabled=dtype_name != "fp32"):
            y = block(xv, b, t)
        loss = (y.float() * dy).sum()
        loss.backward()
        losses.append(loss.item())
        held["dx"] = xv.grad

    tm = time_it(warmup, reps, body)
    what = f"torch gpt block {name} {dtype_name} {attn}"
    require(all(math.isfinite(v) and v == losses[0] for v in losses), what + ": the loss moved or is not finite")
    require(bool(torch.isfinite(held["dx"]).all()), what + ": dx is not finite")
    return {"shape": name, "batch": b, "tokens": t, "width": width, "heads": heads, "dtype": dtype_name,
            "attn": attn, "time": tm, "tokens_per_s": b * t / (tm["median_ms"] * 1e-3)}


def step_row(model_name, batch, dtype_name, attn, warmup, reps, context=None):
    torch.manual_seed(42)
    shape = dict(MODELS[model_name], **({"context": context} if context else {}))
    vocab, context = shape["vocab"], shape["context"]
    model = Gpt(attn=attn, **shape)
    opt, impl = torch_cpu.make_adamw(model.parameters(), lr=1e-3, weight_decay=0.01)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, vocab, (batch, context), generator=g)
    labels = torch.randint(0, vocab, (batch * context,), generator=g)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=DTYPES[dtype_name], enabled=dtype_name != "fp32"):
            loss = F.cross_entropy(model(ids), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())

    tm = time_it(warmup, reps, step)
    what = f"torch gpt step {model_name} {dtype_name} batch {batch} {attn}"
    require(all(math.isfinite(v) for v in losses), what + ": a non-finite loss")
    require(losses[-1] < losses[0], what + ": the loss did not go down")
    return {"model": model_name, "batch": batch, "context": context, "dtype": dtype_name, "attn": attn,
            "optimizer": impl, "params": sum(p.numel() for p in params), "time": tm,
            "tokens_per_s": batch * context / (tm["median_ms"] * 1e-3), "first_loss": losses[0],
            "last_loss": losses[-1]}


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU peer of belay_bench --only gpt")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--long", action="store_true", help="GPT-2 small at context 1024 too (minutes)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    threads = args.threads or torch_cpu.default_threads()
    if args.cpu_time:
        if threads != 1:
            print("torch_gpt: error: --cpu-time counts one thread's CPU time; use --threads 1", file=sys.stderr)
            return 2
        torch_cpu.CLOCK[0] = torch_cpu.time.thread_time
    torch.set_num_threads(threads)
    reps = 3 if args.quick else 11
    # PyTorch's bf16 matmul on a CPU without AVX512-BF16 is a reference path (~1 GFLOP/s
    # here): GPT-2 small's bf16 block gets 3 repetitions, or the row alone takes minutes.
    blocks, steps = [], []
    try:
        for shape in (QUICK_BLOCKS if args.quick else BLOCKS):
            for dt in DTYPES:
                slow = dt == "bf16" and shape[3] >= 768 and torch.backends.cpu.get_cpu_capability() != "AVX512"
                for attn in ("explicit", "sdpa"):
                    blocks.append(block_row(shape, dt, attn, 1 if slow else 2, 3 if slow else reps))
        for batch in (16, 32):
            for dt in DTYPES:
                for attn in ("explicit", "sdpa"):
                    steps.append(step_row("default", batch, dt, attn, 2, 5 if dt == "bf16" else reps))
        if not args.quick:  # seconds per step: one warm-up and 3 timed, SDPA only
            for dt in DTYPES:
                steps.append(step_row("gpt2-small", 4, dt, "sdpa", 1, 3))
        if args.long:  # tens of seconds per step: one warm-up and 2 timed, as belay_bench --long
            for dt in DTYPES:
                steps.append(step_row("gpt2-small", 4, dt, "sdpa", 1, 2, context=1024))
    except torch_cpu.CheckFailure as e:
        print(f"torch_gpt: {e}", file=sys.stderr)
        return 1
    doc = {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "quick": args.quick, "long": args.long,
           "clock": "thread_cpu" if args.cpu_time else "wall", "block": blocks, "step": steps}
    with open(args.json, "w") as f:
        json.dump({"torch": {"gpt": doc}}, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
