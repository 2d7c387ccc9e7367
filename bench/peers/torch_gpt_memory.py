#!/usr/bin/env python3
"""The PyTorch peer of bench/gpt_memory.sh: GPT-2 small's body (12 layers, width 768, 12 heads,
erf GELU, tied head, vocab 256 as belay's byte tokens) trained `--steps` AdamW steps at batch 4
on random tokens, attention through F.scaled_dot_product_attention(is_causal=True); prints the
process's peak RSS in KB (ru_maxrss) and the last loss. One configuration per process.

    torch_gpt_memory.py --context T [--steps 2] [--threads N] [--layers 12]
"""
import argparse
import resource

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (torch.nn.Linear(d, d) for _ in range(4))
        self.fc, self.mlp_proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln_1(x)
        q, k, v = (f(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, width), torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt(256, a.context, 768, a.layers, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 256, (4, a.context + 1))
    for _ in range(a.steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, 256), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"peak_rss_kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
