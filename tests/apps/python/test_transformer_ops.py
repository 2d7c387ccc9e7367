"""belay.embedding and belay.layer_norm (autograd/nn_ops.cpp) against NumPy in float64, forward and
backward, in fp32, fp16 and bf16; their argument errors as belay.UsageError. Then belay.bmm and
the head views (transpose_dims, split_heads, merge_heads) against NumPy, and against PyTorch
where torch is importable (skipped otherwise: CI needs no torch).

Tolerances, set before the first run (as test_var_ops.py): FP32 within RTOL = 1e-5 plus
ATOL = 1e-5 (LayerNorm's sums of 64 terms and its backward's two more: a few hundred FP32
roundings at most, relative to values of order 1). FP16/BF16: the float64 result of the same
rounded inputs within 4 units of the dtype's epsilon, relative and absolute (the inputs and
output rounded, the FP32 math far below them). The embedding's forward is a copy: exact.
"""
import numpy as np
import pytest

import belay

RTOL = 1e-5
ATOL = 1e-5
EPS = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
DTYPES = ["fp32", "fp16", "bf16"]


def f64(v):
    """A Var's or Tensor's values in float64 (FP16/BF16 widened exactly through FP32)."""
    t = v.value if isinstance(v, belay.Var) else v
    return t.to("fp32").numpy().astype(np.float64)


def rounded(a, dtype):
    """a as the dtype stores it, in float64 (what the reference must see)."""
    return f64(belay.tensor(np.asarray(a, np.float32), dtype=dtype))


BELAY_DTYPE = {"fp32": belay.float32, "fp16": belay.float16, "bf16": belay.bfloat16}


def tol(dtype):
    return (RTOL, ATOL) if dtype == "fp32" else (4 * EPS[dtype], 4 * EPS[dtype])


def layer_norm_ref(x, w, b, dy, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return xhat * w + b, dx, (dy * xhat).reshape(-1, x.shape[-1]).sum(0), dy.reshape(-1, x.shape[-1]).sum(0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_numpy_forward_and_backward(dtype):
    rng = np.random.default_rng(1)
    x = rng.uniform(1.0, 5.0, (2, 3, 64)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, 64).astype(np.float32)
    r = rng.uniform(-1.0, 1.0, (2, 3, 64)).astype(np.float32)
    X, R = rounded(x, dtype), rounded(r, dtype)
    xv = belay.Var(belay.tensor(x, dtype=dtype), requires_grad=True)
    wv, bv = belay.Var(w, requires_grad=True), belay.Var(b, requires_grad=True)
    y = belay.layer_norm(xv, wv, bv, eps=1e-5)
    assert y.dtype == BELAY_DTYPE[dtype]  # the input's dtype
    assert y.shape == (2, 3, 64)
    belay.sum(y * belay.Var(belay.tensor(r, dtype=dtype))).backward()
    yr, dx, dw, db = layer_norm_ref(X, w.astype(np.float64), b.astype(np.float64), R)
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(f64(y), yr, rtol=rtol, atol=atol)
    np.testing.assert_allclose(f64(xv.grad), dx, rtol=rtol, atol=atol)
    # dweight and dbias are sums over 6 rows in FP32 of products rounded to the dtype: scale
    # the bound by the rows summed.
    np.testing.assert_allclose(wv.grad.numpy(), dw, rtol=rtol, atol=6 * atol)
    np.testing.assert_allclose(bv.grad.numpy(), db, rtol=rtol, atol=6 * atol)


def test_layer_norm_without_weight_and_bias():
    x = np.random.default_rng(2).uniform(-2, 2, (4, 10)).astype(np.float32)
    y = belay.layer_norm(x).numpy().astype(np.float64)
    X = x.astype(np.float64)
    ref = (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_gathers_rows_and_sums_repeated_ids_in_fp32(dtype):
    rng = np.random.default_rng(3)
    table = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    ids = np.array([[1, 4, 1], [0, 1, 6]])  # id 1 three times
    tv = belay.Var(belay.tensor(table, dtype=dtype), requires_grad=True)
    out = belay.embedding(tv, ids)
    assert out.shape == (2, 3, 5)
    T = rounded(table, dtype)
    np.testing.assert_array_equal(f64(out), T[ids])  # a copy: exact
    r = rng.uniform(-1, 1, (2, 3, 5)).astype(np.float32)
    R = rounded(r, dtype)
    belay.sum(out * belay.Var(belay.tensor(r, dtype=dtype))).backward()
    ref = np.zeros((7, 5))
    np.add.at(ref, ids.reshape(-1), R.reshape(-1, 5))
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(f64(tv.grad), ref, rtol=rtol, atol=atol)


def test_embedding_and_layer_norm_errors_are_usage_errors():
    table = belay.Var(np.zeros((4, 3), np.float32), requires_grad=True)
    for bad in ([4], [-1], [1.5]):
        with pytest.raises(belay.UsageError, match="not a row of the table"):
            belay.embedding(table, np.array(bad))
    with pytest.raises(belay.UsageError, match=r"matrix \[V, D\]"):
        belay.embedding(belay.Var(np.zeros(4, np.float32)), np.array([0]))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(belay.UsageError, match="weight and bias must be"):
        belay.layer_norm(x, belay.Var(np.ones(4, np.float32)))
    with pytest.raises(belay.UsageError, match="last dim"):
        belay.layer_norm(belay.Var(np.zeros((2, 0), np.float32)))
    with pytest.raises(belay.UsageError, match="unknown op class"):
        belay.autocast("fp16", fp32_ops="layernorm")
    with belay.autocast("bf16", fp32_ops="embedding,layer_norm"):  # the new classes are known
        assert belay.layer_norm(belay.tensor(x, dtype="bf16")).dtype == belay.float32


def test_embedding_and_layer_norm_modules_in_a_python_model():
    class Tiny(belay.Module):
        def __init__(self):
            super().__init__()
            self.wte = belay.Embedding(1000, 16, seed=1)
            self.ln = belay.LayerNorm(16)

        def forward(self, ids):
            return self.ln(self.wte(ids))

    m = Tiny()
    assert set(m.state_dict()) == {"wte.weight", "ln.weight", "ln.bias"}
    w = m.wte.weight.numpy()
    assert abs(float(w.std()) - 0.02) < 1e-3 and abs(float(w.mean())) < 1e-3  # GPT-2's init, 16000 draws
    ids = np.array([[5, 999, 5]])
    y = m(ids)
    assert y.shape == (1, 3, 16)
    W = w.astype(np.float64)[ids]
    ref = (W - W.mean(-1, keepdims=True)) / np.sqrt(W.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(f64(y), ref, rtol=RTOL, atol=ATOL)
    belay.sum(y * belay.Var(np.ones((1, 3, 16), np.float32))).backward()
    assert m.ln.bias.grad.numpy().tolist() == [3.0] * 16  # d sum / d bias: one per row
    with pytest.raises(belay.UsageError, match="not a row of the table"):
        m(np.array([1000]))


def bmm_ref(a, b, ta, tb):
    """op(a) @ op(b) in float64, b broadcast when it is a matrix."""
    A = np.swapaxes(a, -1, -2) if ta else a
    B = np.swapaxes(b, -1, -2) if tb else b
    return A @ B


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shared", [False, True])
def test_bmm_matches_numpy_forward_and_backward(dtype, ta, tb, shared):
    # [2, 3] items of op(a) [5, 7] x op(b) [7, 4]: sums of 7 products (and, for dB shared over
    # the items, of 6 * 5 = 30 in FP32) of values rounded to the dtype.
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (2, 3) + ((7, 5) if ta else (5, 7))).astype(np.float32)
    b = rng.uniform(-1, 1, (() if shared else (2, 3)) + ((4, 7) if tb else (7, 4))).astype(np.float32)
    r = rng.uniform(-1, 1, (2, 3, 5, 4)).astype(np.float32)
    A, B, R = rounded(a, dtype), rounded(b, dtype), rounded(r, dtype)
    av = belay.Var(belay.tensor(a, dtype=dtype), requires_grad=True)
    bv = belay.Var(belay.tensor(b, dtype=dtype), requires_grad=True)
    y = belay.bmm(av, bv, trans_a=ta, trans_b=tb)
    assert y.dtype == BELAY_DTYPE[dtype] and y.shape == (2, 3, 5, 4)
    belay.sum(y * belay.Var(belay.tensor(r, dtype=dtype))).backward()
    rtol, atol = tol(dtype)
    atol = 7 * atol if dtype == "fp32" else atol  # FP32: 7-term sums of values of order 1
    np.testing.assert_allclose(f64(y), bmm_ref(A, B, ta, tb), rtol=rtol, atol=atol)
    da = R @ (np.swapaxes(B, -1, -2) if not tb else B)  # dC op(B)^T, as [.., 5, 7]
    db_full = np.swapaxes(A if not ta else np.swapaxes(A, -1, -2), -1, -2) @ R  # op(A)^T dC, [.., 7, 4]
    if ta:
        da = np.swapaxes(da, -1, -2)
    if tb:
        db_full = np.swapaxes(db_full, -1, -2)
    db = db_full.sum(axis=(0, 1)) if shared else db_full
    np.testing.assert_allclose(f64(av.grad), da, rtol=rtol, atol=4 * atol)
    np.testing.assert_allclose(f64(bv.grad), db, rtol=rtol, atol=30 * atol if shared else 4 * atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_views_are_exact_copies_with_their_backward(dtype):
    rng = np.random.default_rng(12)
    x = rng.uniform(-1, 1, (2, 5, 12)).astype(np.float32)  # [B, T, H * d], H = 3, d = 4
    X = rounded(x, dtype)
    xv = belay.Var(belay.tensor(x, dtype=dtype), requires_grad=True)
    h = belay.split_heads(xv, 3)
    assert h.shape == (2, 3, 5, 4) and h.dtype == BELAY_DTYPE[dtype]
    np.testing.assert_array_equal(f64(h), X.reshape(2, 5, 3, 4).transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(f64(belay.merge_heads(h)), X)
    t = belay.transpose_dims(h, 0, -1)
    np.testing.assert_array_equal(f64(t), np.swapaxes(X.reshape(2, 5, 3, 4).transpose(0, 2, 1, 3), 0, -1))
    r = rng.uniform(-1, 1, (4, 3, 5, 2)).astype(np.float32)
    belay.sum(t * belay.Var(belay.tensor(r, dtype=dtype))).backward()
    R = rounded(r, dtype)
    np.testing.assert_array_equal(f64(xv.grad), np.swapaxes(R, 0, -1).transpose(0, 2, 1, 3).reshape(2, 5, 12))


def test_bmm_errors_and_autocast():
    q = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(belay.UsageError, match="leading dims differ"):
        belay.bmm(q, np.zeros((3, 4, 5), np.float32))
    with pytest.raises(belay.UsageError, match="inner sizes differ"):
        belay.bmm(q, q)
    with pytest.raises(belay.UsageError, match="heads"):
        belay.split_heads(q, 3)
    with belay.autocast("fp16"):
        assert belay.bmm(q, q, trans_b=True).dtype == belay.float16
    with belay.autocast("bf16", fp32_ops="bmm"):
        assert belay.bmm(q, q, trans_b=True).dtype == belay.float32


def test_bmm_and_head_views_match_torch():
    """Parity with PyTorch: the attention scores and output of causal-free heads, forward and
    backward, FP32 within 1e-5 (sums of 8 products), through torch.matmul and transpose."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (not needed in CI)")
    rng = np.random.default_rng(13)
    x = rng.uniform(-1, 1, (2, 6, 8)).astype(np.float32)  # [B, T, C], 2 heads of 4
    w = rng.uniform(-1, 1, (8, 8)).astype(np.float32)
    xv, wv = belay.Var(x, requires_grad=True), belay.Var(w, requires_grad=True)
    q = belay.split_heads(belay.bmm(xv, wv), 2)
    s = belay.bmm(q, q, trans_b=True)
    y = belay.merge_heads(belay.bmm(s, q))
    belay.sum(y * y).backward()
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    qt = (xt @ wt).reshape(2, 6, 2, 4).transpose(1, 2)
    yt = ((qt @ qt.transpose(-1, -2)) @ qt).transpose(1, 2).reshape(2, 6, 8)
    (yt * yt).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xv.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wv.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def attention_ref(q, k, v, g, causal, scale):
    """softmax(scale q k^T, masked) v and its gradients for the upstream gradient g, in float64;
    causal aligns the mask at the end (query i sees keys j <= i + Tk - Tq)."""
    tq, tk = q.shape[-2], k.shape[-2]
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        mask = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        s = np.where(mask, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = p @ v
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return y, scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(7, 7), (1, 9), (5, 9)])
def test_attention_matches_numpy_forward_and_backward(dtype, causal, tq, tk):
    # [2, 3] heads of d = 8: sums of 8 products, then of up to 9 probabilities; in FP16/BF16 the
    # inputs are the dtype's (the reference sees them rounded) and the results rounded once.
    rng = np.random.default_rng(14)
    q, g = (rng.uniform(-1, 1, (2, 3, tq, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.uniform(-1, 1, (2, 3, tk, 8)).astype(np.float32) for _ in range(2))
    Q, K, V, G = (rounded(a, dtype) for a in (q, k, v, g))
    qv, kv, vv = (belay.Var(belay.tensor(a, dtype=dtype), requires_grad=True) for a in (q, k, v))
    y = belay.attention(qv, kv, vv, causal=causal)
    assert y.dtype == BELAY_DTYPE[dtype] and y.shape == (2, 3, tq, 8)
    belay.sum(y * belay.Var(belay.tensor(g, dtype=dtype))).backward()
    ref = attention_ref(Q, K, V, G, causal, 1 / np.sqrt(8))
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(f64(y), ref[0], rtol=rtol, atol=atol)
    for got, want in zip((qv.grad, kv.grad, vv.grad), ref[1:]):
        np.testing.assert_allclose(f64(got), want, rtol=rtol, atol=(10 if dtype == "fp32" else 2) * atol)


def test_attention_heads_side_by_side_is_split_attention_merge():
    """heads=3 on [B, T, 3 d] gives the bits of split_heads, attention, merge_heads, forward and
    gradients (the same kernels on the same values; only where the rows are read differs)."""
    rng = np.random.default_rng(16)
    q, g = (rng.uniform(-1, 1, (2, 9, 3 * 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.uniform(-1, 1, (2, 11, 3 * 8)).astype(np.float32) for _ in range(2))
    side = [belay.Var(a, requires_grad=True) for a in (q, k, v)]
    split = [belay.Var(a, requires_grad=True) for a in (q, k, v)]
    y1 = belay.attention(*side, causal=True, heads=3)
    y2 = belay.merge_heads(belay.attention(*(belay.split_heads(x, 3) for x in split), causal=True))
    assert y1.shape == (2, 9, 24)
    belay.sum(y1 * belay.Var(g)).backward()
    belay.sum(y2 * belay.Var(g)).backward()
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())
    for a, b in zip(side, split):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    with pytest.raises(belay.UsageError, match="5 heads do not divide"):
        belay.attention(q, k, v, heads=5)


def test_attention_errors_and_autocast():
    q = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(belay.UsageError, match="k and v"):
        belay.attention(q, np.zeros((2, 3, 5), np.float32), q)
    with pytest.raises(belay.UsageError, match="head dim 129"):
        z = np.zeros((1, 2, 129), np.float32)
        belay.attention(z, z, z)
    with belay.autocast("bf16"):
        assert belay.attention(q, q, q).dtype == belay.bfloat16
    with belay.autocast("fp16", fp32_ops="attention"):
        assert belay.attention(q, q, q).dtype == belay.float32


def test_attention_matches_torch_sdpa():
    """Parity with F.scaled_dot_product_attention(is_causal=True) and an explicit scale, forward
    and backward, FP32 within 1e-5 (the same math; roundings differ in the last bits)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (not needed in CI)")
    rng = np.random.default_rng(15)
    q, k, v, g = (rng.uniform(-1, 1, (2, 4, 70, 64)).astype(np.float32) for _ in range(4))
    qv, kv, vv = (belay.Var(a, requires_grad=True) for a in (q, k, v))
    belay.sum(belay.attention(qv, kv, vv, causal=True, scale=0.3) * belay.Var(g)).backward()
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    yt = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=0.3)
    (yt * torch.tensor(g)).sum().backward()
    y = belay.attention(belay.Var(q), belay.Var(k), belay.Var(v), causal=True, scale=0.3)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    for a, b in ((qv, qt), (kv, kt), (vv, vt)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-4)
