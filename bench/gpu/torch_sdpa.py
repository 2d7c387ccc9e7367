"""PyTorch's fused attention (torch.nn.functional.scaled_dot_product_attention, causal) at the
shape of gpu_bench.cu's attention section, B 4, H 12, T 1024, d 64, FP16 and BF16, for
bench/gpu-check.sh: milliseconds forward and forward + backward, timed with CUDA events
after a warm-up. PyTorch picks its backend (FlashAttention-2 or cuDNN on an H200); the name
of the one enabled is recorded. Prints one JSON object.
"""
import json

import torch
import torch.nn.functional as F


def time_ms(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def bench(dtype):
    b, h, t, d = 4, 12, 1024, 64
    q, k, v = (torch.rand(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True) * 2 - 1 for _ in range(3))
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    g = torch.rand(b, h, t, d, device="cuda", dtype=dtype) * 2 - 1

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(g)

    for _ in range(3):
        fwd()
        both()
    torch.cuda.synchronize()
    return {"dtype": str(dtype).replace("torch.", ""), "shape": "B4 H12 T1024 d64 causal",
            "forward_ms": round(time_ms(fwd, 20), 4), "forward_backward_ms": round(time_ms(both, 10), 4)}


def main():
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return
    rows = [bench(torch.float16), bench(torch.bfloat16)]
    print(json.dumps({"torch": torch.__version__, "sdpa": rows}))


if __name__ == "__main__":
    main()
