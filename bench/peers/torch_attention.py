#!/usr/bin/env python3
"""PyTorch on the CPU as the peer of belay_bench's `attention` section (bench/attention.cpp):
causal attention forward, and forward + backward ((y * g).sum().backward()), at the same shapes
(GPT-2 small's B 4, H 12, T 1024, d 64, quick: T 256; the demo GPT's B 32, H 4, T 64, d 32),
fp32 and bf16 (under CPU autocast), the same repetitions and statistics:

  sdpa      F.scaled_dot_product_attention(q, k, v, is_causal=True): PyTorch's fused CPU kernel
  explicit  q k^T / sqrt(d), masked_fill, softmax, @ v: the three-op path (belay's naive)

    torch_attention.py [--quick] [--threads N] [--cpu-time] --json FILE

Runs in the venv of bench/peers/setup_torch_venv.sh, never in CI. Check: sdpa and explicit
agree in fp32 within 1e-4 of max |explicit|.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cpu  # noqa: E402  (the harness)
from torch_cpu import require, time_it  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def explicit(q, k, v):
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rows(name, b, h, t, d, warm, reps):
    out = []
    heads = b * h
    fwd_flops = 2.0 * heads * t * t * d
    for dname, dt in DTYPES.items():
        gen = torch.Generator().manual_seed(11)
        q, k, v, g = (torch.rand(b, h, t, d, generator=gen) * 2 - 1 for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        for path, fn in (("sdpa", sdpa), ("explicit", explicit)):
            def forward():
                with torch.no_grad(), torch.autocast("cpu", dtype=dt, enabled=dt != torch.float32):
                    fn(q, k, v)

            def forward_backward():
                for x in (q, k, v):
                    x.grad = None
                with torch.autocast("cpu", dtype=dt, enabled=dt != torch.float32):
                    y = fn(q, k, v)
                (y.float() * g).sum().backward()

            f = time_it(warm, reps, forward)
            fb = time_it(warm, reps, forward_backward)
            out.append({"shape": name, "path": path, "dtype": dname, "forward": f, "forward_backward": fb,
                        "forward_gflops": fwd_flops / (f["median_ms"] * 1e6),
                        "forward_backward_gflops": 3.5 * fwd_flops / (fb["median_ms"] * 1e6)})
    with torch.no_grad():
        a, e = sdpa(q, k, v), explicit(q, k, v)
        require(float((a - e).abs().max()) <= 1e-4 * float(e.abs().max()), name + ": sdpa and explicit differ")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    threads = args.threads or torch_cpu.default_threads()
    if args.cpu_time:
        if threads != 1:
            print("torch_attention: error: --cpu-time counts one thread's CPU time; use --threads 1", file=sys.stderr)
            return 2
        torch_cpu.CLOCK[0] = torch_cpu.time.thread_time
    torch.set_num_threads(threads)
    warm, reps = (1, 3) if args.quick else (2, 7)
    time = rows("gpt2_small", 4, 12, 256 if args.quick else 1024, 64, warm, reps)
    time += rows("demo", 32, 4, 64, 32, warm, reps)
    doc = {"peer": "pytorch " + torch.__version__, "threads": torch.get_num_threads(), "time": time}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
