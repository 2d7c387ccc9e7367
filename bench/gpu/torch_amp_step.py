"""PyTorch's mixed-precision optimizer step on the tensor sizes gpu_bench.cu uses, for
bench/gpu-check.sh: GradScaler.unscale_ + clip_grad_norm_ + GradScaler.step with
AdamW(fused=True) + GradScaler.update. FP32 parameters and FP32 gradients (autocast keeps
parameters in FP32); gradients filled once with values in [-1, 1) * 2^16.

Each iteration unscales the gradients in place, so after a few iterations they are tiny;
that changes no byte moved and no kernel launched. PyTorch's step() reads found_inf on
the host (.item()), a synchronisation that is part of what is measured.
Prints one JSON object.
--device cpu: the same calls on small tensors on the CPU, timed by the wall clock only: a
rehearsal of the script's API use with whatever PyTorch is at hand (the lent GPU machine
has 2.11; nothing here is newer: torch.amp.GradScaler(device) is from 2.3, fused AdamW 2.0).
"""
import json
import sys
import time

import torch


def sizes(big):
    s = []
    for _ in range(64 if big else 4):
        s += [2048 * 2048 if big else 4096, 2048]
    return s + [1, 129, 1000]


def main():
    on_cpu = sys.argv[1:] == ["--device", "cpu"]
    if not on_cpu and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 77
    dev = torch.device("cpu" if on_cpu else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    params = []
    for n in sizes(not on_cpu):
        p = torch.nn.Parameter(torch.full((n,), 0.5, device=dev))
        p.grad = (torch.rand(n, device=dev, generator=gen) * 2 - 1) * 65536.0
        params.append(p)
    total = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler(dev.type, init_scale=65536.0)
    # The scaler makes its scale tensor in its first scale() call (a training loop scales the
    # loss there); without one, unscale_ stops with "_scale is None". No loss here: a scalar.
    scaler.scale(torch.ones((), device=dev))

    def step():
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()

    sync = (lambda: None) if on_cpu else torch.cuda.synchronize
    for _ in range(3):
        step()
    sync()
    iters = 2 if on_cpu else 20
    if not on_cpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    if not on_cpu:
        start.record()
    for _ in range(iters):
        step()
    if not on_cpu:
        end.record()
    sync()
    wall_ms = (time.perf_counter() - t0) * 1e3 / iters
    ms = wall_ms if on_cpu else start.elapsed_time(end) / iters
    # unscale_ reads+writes grads (8), the norm reads them (4), the clip multiply reads+writes
    # them (8), fused AdamW reads grad, p, m, v (16) and writes p, m, v (12).
    bytes_per_param = 8 + 4 + 8 + 16 + 12
    print(json.dumps({
        "torch": torch.__version__,
        "params": total,
        "tensors": len(params),
        "step_ms": round(ms, 4),
        "wall_ms": round(wall_ms, 4),
        "bytes_per_param": bytes_per_param,
        "step_gbs": round(bytes_per_param * total / (ms * 1e-3) / 1e9, 1),
        "correct": bool(all(torch.isfinite(p).all().item() for p in params[:2]))
                   and float(params[0][0].detach()) != 0.5,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
