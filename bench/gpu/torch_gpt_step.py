"""PyTorch's training step of the GPT that bench/gpu-check.sh times belay on: GPT-2 small's body
(12 layers, width 768, 12 heads, context 1024, batch 4) over belay's byte vocabulary (256,
head tied to wte), the same block as belay's (pre-LN, separate q, k, v Linears, erf GELU,
LayerNorm eps 1e-5, GPT-2's N(0, 0.02) initialisation), attention by F.scaled_dot_product_attention (causal; PyTorch picks its
fused kernel). One step: zero_grad, autocast (bf16; fp16 with a GradScaler), cross_entropy,
backward, clip_grad_norm_(1.0), AdamW(fused=True, lr 3e-3, weight decay 0.1 as belay's GPT
defaults), the loss read on the host every 10th step only (belay reads its rows
asynchronously). Eager mode, no torch.compile. Timed with CUDA events over 30 steps after 5
warm-up steps. Prints one JSON object: tokens/s and ms per step for each dtype.
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, WIDTH, HEADS, CONTEXT, BATCH, VOCAB = 12, 768, 12, 1024, 4, 256
WARMUP, TIMED = 5, 30


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.fc, self.mlp_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln_1(x)
        q, k, v = (p(h).view(b, t, HEADS, c // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        for m in self.modules():  # GPT-2's initialisation, as belay's GPT: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # the tied head


def run(dtype_name):
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    model = Gpt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]
    losses = []

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if i % 10 == 0:
            losses.append(loss.item())

    for i in range(WARMUP):
        step(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(TIMED):
        step(i)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / TIMED
    assert all(math.isfinite(v) for v in losses), f"non-finite loss: {losses}"
    params = sum(p.numel() for p in model.parameters())
    return {"dtype": dtype_name, "step_ms": round(ms, 3), "tokens_per_s": round(BATCH * CONTEXT / ms * 1e3),
            "params": params, "losses_every_10": [round(v, 4) for v in losses],
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def main():
    shape = {"layers": LAYERS, "width": WIDTH, "heads": HEADS, "context": CONTEXT, "batch": BATCH, "vocab": VOCAB}
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "shape": shape,
           "steps": {"warmup": WARMUP, "timed": TIMED}, "runs": []}
    for name in ("bf16", "fp16"):
        torch.cuda.reset_peak_memory_stats()
        out["runs"].append(run(name))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
