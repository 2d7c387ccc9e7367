"""belay against PyTorch, the same Linear model from the same init on the same data:
  FP32: AdamW (decay on the weight only, as belay does for 1-D parameters) + clip_grad_norm_
  FP16: autocast + GradScaler (PyTorch's order: scale, backward, unscale_, clip, step,
        update), an inf planted in a gradient at two steps, growth every 4 clean steps;
        (a) belay's weight gradients in FP16 as PyTorch's autocast makes them, from scale
        2^16: the scale grows until a gradient overflows FP16 on its own, at the same step
        in both; (b) belay's default FP32 gradient buffers, from 2^10 (no natural overflow:
        with FP32 buffers belay would not overflow where PyTorch's FP16 gradient does).
Compared per step: the loss, the pre-clip gradient norm (unscaled), and, FP16, the
skip/scale sequence. Skipped where torch is not importable (CI needs no torch).

Tolerances, set before the first run and never widened:
  FP32: relative 1e-4 on loss and norm. Both compute in FP32 but sum in different orders
        (Eigen vs PyTorch's CPU GEMM); over 30 Adam steps such differences stay near 1e-6.
        Any difference of method (bias correction, decay on the bias, clip coefficient,
        eps placement) moves the numbers by 1e-3 or more.
  FP16: relative 1e-2 on loss and norm: both round the forward's products to FP16 (eps
        2^-10 ~ 1e-3) but may keep weight gradients in different precisions; ten FP16 eps.
        The skip and scale sequences must be identical: they are decisions, not numbers.
"""
import math

import numpy as np
import pytest

import belay

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the belay-vs-PyTorch parity test needs `import torch` (not needed in CI)")

FP32_RTOL = 1e-4
FP16_RTOL = 1e-2
STEPS = 30
LR = 3e-2
INJECT = {3, 9}  # steps whose first weight-gradient element becomes inf (FP16 run)


def data(seed=0, n=64, d_in=16, d_out=4):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    teacher = 0.5 * rng.standard_normal((d_out, d_in), dtype=np.float32)
    noise = 0.01 * rng.standard_normal((n, d_out), dtype=np.float32)
    return x, (x @ teacher.T + noise).astype(np.float32)


def run_belay(x, y, dtype, scaler_options, grad_dtype):
    model = belay.Linear(16, 4, seed=0)
    init = model.state_dict()
    model.set_working_dtype(dtype)
    model.set_grad_dtype(grad_dtype)
    opt = belay.AdamW(model, lr=LR, weight_decay=0.01)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=dtype == "fp16", **scaler_options), max_norm=1.0)
    if dtype == "fp16":
        step.set_after_backward(lambda s, o: o.grads()[0].set_element(0, math.inf) if s in INJECT else None)

    def loss_fn(k):
        with belay.autocast(dtype, enabled=dtype != "fp32"):
            return belay.mse_loss(model(x), y)
    return init, [step.run(loss_fn) for _ in range(STEPS)]


def run_torch(init, x, y, dtype, scaler_options):
    model = torch.nn.Linear(16, 4)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(init["weight"]))
        model.bias.copy_(torch.from_numpy(init["bias"]))
    opt = torch.optim.AdamW([{"params": [model.weight], "weight_decay": 0.01},
                             {"params": [model.bias], "weight_decay": 0.0}], lr=LR)
    fp16 = dtype == "fp16"
    scaler = torch.amp.GradScaler("cpu", enabled=fp16, **scaler_options)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    rows = []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = torch.nn.functional.mse_loss(model(xt), yt)
        scaler.scale(loss).backward()
        if fp16 and s in INJECT:
            model.weight.grad[0, 0] = math.inf
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = scaler.get_scale() if fp16 else 1.0
        scaler.step(opt)
        scaler.update()
        after = scaler.get_scale() if fp16 else 1.0
        # growth happens only after growth_interval clean steps, so a lower scale means found_inf
        rows.append(dict(loss=loss.item(), norm=norm.item(), skipped=after < before, scale=after))
    return rows


def compare(dtype, rtol, scaler_options, grad_dtype="fp32"):
    x, y = data()
    init, ours = run_belay(x, y, dtype, scaler_options, grad_dtype)
    theirs = run_torch(init, x, y, dtype, scaler_options)
    worst_loss = worst_norm = 0.0
    for s, (a, b) in enumerate(zip(ours, theirs)):
        assert a.skipped == b["skipped"], f"step {s}: belay skipped={a.skipped}, torch {b['skipped']}"
        assert a.scaler_scale == b["scale"], f"step {s}: scale {a.scaler_scale} vs {b['scale']}"
        worst_loss = max(worst_loss, abs(a.loss - b["loss"]) / abs(b["loss"]))
        if not a.skipped:
            worst_norm = max(worst_norm, abs(a.grad_l2_pre_clip - b["norm"]) / b["norm"])
    print(f"\n{dtype} (belay grads {grad_dtype}): {STEPS} steps, loss {theirs[0]['loss']:.5g} -> {theirs[-1]['loss']:.5g}; "
          f"max relative difference: loss {worst_loss:.3g}, pre-clip norm {worst_norm:.3g} (bound {rtol:g}); "
          f"skips at {[s for s, r in enumerate(ours) if r.skipped]}, final scale {ours[-1].scaler_scale:g}")
    assert worst_loss <= rtol and worst_norm <= rtol
    assert theirs[-1]["loss"] < 0.5 * theirs[0]["loss"]  # the comparison covers a run that learns
    return ours


def test_fp32_adamw_with_clipping_matches_pytorch():
    compare("fp32", FP32_RTOL, {})


def test_fp16_autocast_and_grad_scaler_match_pytorch_fp16_grads():
    ours = compare("fp16", FP16_RTOL, {"init_scale": 2.0 ** 16, "growth_interval": 4}, grad_dtype="fp16")
    skips = [s for s, r in enumerate(ours) if r.skipped]
    assert set(skips) > INJECT  # the planted ones and at least one overflow of its own
    assert len({r.scaler_scale for r in ours}) > 2  # the scale moved both ways


def test_fp16_autocast_and_grad_scaler_match_pytorch_fp32_grads():
    ours = compare("fp16", FP16_RTOL, {"init_scale": 2.0 ** 10, "growth_interval": 4})
    assert [s for s, r in enumerate(ours) if r.skipped] == sorted(INJECT)
    assert len({r.scaler_scale for r in ours}) > 2


def test_var_operators_match_pytorch_values_and_gradients():
    """The Var operators (autograd/math_ops.cpp) against torch on one graph: broadcasting arithmetic with a
    row and a column, **, exp/log/tanh/sigmoid, softmax/log_softmax (causal too), sum/mean over
    an axis, .T, reshape and indexing. FP32 on both sides, same inputs: relative 1e-5 (a few
    dozen FP32 roundings in different orders; a wrong formula or gradient is off by far more)."""
    rng = np.random.default_rng(3)
    a = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
    row = rng.uniform(1, 2, (6,)).astype(np.float32)
    col = rng.uniform(1, 2, (4, 1)).astype(np.float32)
    s = rng.uniform(-2, 2, (2, 4, 4)).astype(np.float32)

    def graph(lib, a, row, col, s):
        if lib is torch:
            exp, log, tanh, sig = torch.exp, torch.log, torch.tanh, torch.sigmoid
            softmax = lambda x: torch.softmax(x, -1)  # noqa: E731
            log_softmax = lambda x: torch.log_softmax(x, -1)  # noqa: E731
            mask = torch.ones(4, 4, dtype=torch.bool).tril()
            causal = lambda x: torch.softmax(x.masked_fill(~mask, float("-inf")), -1)  # noqa: E731
            total = lambda x, axis=None, keep=False: x.sum() if axis is None else x.sum(axis, keepdim=keep)  # noqa: E731
            avg = lambda x, axis, keep=False: x.mean(axis, keepdim=keep)  # noqa: E731
        else:
            exp, log, tanh, sig = belay.exp, belay.log, belay.tanh, belay.sigmoid
            softmax, log_softmax = belay.softmax, belay.log_softmax
            causal = lambda x: belay.softmax(x, causal=True)  # noqa: E731
            total = lambda x, axis=None, keep=False: belay.sum(x, axis, keep)  # noqa: E731
            avg = lambda x, axis, keep=False: belay.mean(x, axis, keep)  # noqa: E731
        h = (tanh(a) - row) / col + 1.0 - 2.0 / row
        p = log_softmax(sig(h) * exp(-a) + a ** 2) + softmax(a.T).T * col
        q = total(avg(p, 1, True) * log(row[:4].reshape(4, 1)), 0) + total(p[1] * p[-1]) + total(causal(s) * s)
        return total(q)

    tb = [torch.tensor(v, requires_grad=True) for v in (a, row, col, s)]
    bb = [belay.Var(v, requires_grad=True) for v in (a, row, col, s)]
    lt, lb = graph(torch, *tb), graph(belay, *bb)
    lt.backward()
    lb.backward()
    np.testing.assert_allclose(float(lb), lt.item(), rtol=1e-5)
    for t, b in zip(tb, bb):
        np.testing.assert_allclose(b.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_embedding_and_layer_norm_match_pytorch(dtype):
    """belay.embedding and belay.layer_norm, forward and backward, against F.embedding and
    F.layer_norm on the same inputs (a GPT's first steps: token rows, a pre-LayerNorm, ids
    repeated). FP32: relative 1e-5 (sums of 48 terms in different orders; a wrong formula or a
    lost term is off by far more). BF16 (activations in BF16, weight and bias FP32, both
    libraries compute the statistics in FP32 and round the result once): 2 BF16 epsilons
    relative and absolute (one rounding each side may land on neighbouring BF16 values); the
    gradients of the table, weight and bias sum up to 8 rows, so their absolute bound is 8
    times that. Weight and bias are cast to the activations' dtype on both sides. Stated
    before the first run. FP16 is left out: PyTorch's CPU layer_norm in FP16 is not
    the reference belay's kernel is meant to match (it is BF16 that CPUs train in)."""
    import torch.nn.functional as F
    rtol = atol = 1e-5 if dtype == "fp32" else 2 * 2.0 ** -7
    tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
    rng = np.random.default_rng(7)
    table = rng.normal(0, 1, (11, 48)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 48).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, 48).astype(np.float32)
    ids = np.array([[3, 1, 3, 10], [0, 3, 7, 1]])
    r = rng.uniform(-1, 1, (2, 4, 48)).astype(np.float32)

    tt = torch.tensor(table, requires_grad=True)
    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    th = F.embedding(torch.tensor(ids), tt.to(tdt))
    ty = F.layer_norm(th, (48,), tw.to(tdt), tb.to(tdt), 1e-5)
    (ty.float() * torch.tensor(r)).sum().backward()

    bt = belay.Var(belay.tensor(table), requires_grad=True)
    bw, bb = belay.Var(w, requires_grad=True), belay.Var(b, requires_grad=True)
    bh = belay.embedding(belay.cast(bt, dtype), ids)
    by = belay.layer_norm(bh, belay.cast(bw, dtype), belay.cast(bb, dtype), eps=1e-5)
    belay.sum(belay.cast(by, "fp32") * belay.Var(r)).backward()

    np.testing.assert_allclose(by.value.to("fp32").numpy(), ty.float().detach().numpy(), rtol=rtol, atol=atol)
    for got, want in ((bt, tt), (bw, tw), (bb, tb)):
        np.testing.assert_allclose(got.grad.to("fp32").numpy(), want.grad.float().numpy(), rtol=rtol, atol=atol * 8)
