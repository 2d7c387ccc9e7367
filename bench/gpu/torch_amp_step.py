"""PyTorch's mixed-precision optimizer step on the tensor sizes gpu_bench.cu uses, for
bench/gpu-check.sh: GradScaler.unscale_ + clip_grad_norm_ + GradScaler.step with
AdamW(fused=True) + GradScaler.update. FP32 parameters and FP32 gradients (autocast keeps
parameters in FP32); gradients filled once with values in [-1, 1) * 2^16.

Each iteration unscales the gradients in place, so after a few iterations they are tiny;
that changes no byte moved and no kernel launched. PyTorch's step() reads found_inf on
the host (.item()), a synchronisation that is part of what is measured.
Prints one JSON object.
"""
import json
import sys
import time

import torch


def sizes():
    s = []
    for _ in range(64):
        s += [2048 * 2048, 2048]
    return s + [1, 129, 1000]


def main():
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 77
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    params = []
    for n in sizes():
        p = torch.nn.Parameter(torch.full((n,), 0.5, device=dev))
        p.grad = (torch.rand(n, device=dev, generator=gen) * 2 - 1) * 65536.0
        params.append(p)
    total = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=65536.0)

    def step():
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    iters = 20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / iters
    ms = start.elapsed_time(end) / iters
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
                   and float(params[0][0]) != 0.5,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
