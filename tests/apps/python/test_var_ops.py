"""The Var operators a PyTorch user reaches for, against NumPy in float64:
arithmetic with broadcasting and Python scalars, **, exp/log/tanh/sigmoid, softmax and
log_softmax (and the causal mask), sum/mean over an axis, .T, .reshape, indexing, float(),
np.asarray(), and a repr that shows the values.

Tolerances, set before the first run: FP32 results of a few FP32 operations on the same
(FP32) inputs are within RTOL = 1e-5 (about 80 FP32 roundings: the composites below chain at
most a dozen ops, each within 2 ulp) plus ATOL = 1e-6 for values near 0. FP16/BF16 results are
compared with the float64 result of the same rounded inputs within 4 units of the dtype's
epsilon (two roundings of the input and the output, and the FP32 math, far below them).
Gradients are checked against the hand-derived float64 gradient of the same objective.
"""
import math

import numpy as np
import pytest

import belay

RTOL = 1e-5
ATOL = 1e-6
EPS = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}


def leaf(a):
    return belay.Var(np.asarray(a, np.float32), requires_grad=True)


def rng_values(shape, seed, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def grad_of(objective, *arrays):
    """The value and the gradients of objective(*vars) for leaves made from arrays."""
    vs = [leaf(a) for a in arrays]
    out = objective(*vs)
    out.backward()
    return out, [v.grad.numpy().astype(np.float64) for v in vs]


def close(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# ---- arithmetic, broadcasting, scalars

def test_sub_div_neg_pow_match_numpy_with_gradients():
    a, b = rng_values((3, 4), 1), rng_values((3, 4), 2, 1.0, 2.0)
    w = rng_values((3, 4), 3)
    A, B = a.astype(np.float64), b.astype(np.float64)
    out, (ga, gb) = grad_of(lambda x, y: belay.sum((x - y) / y * belay.Var(w) + (-x) ** 2.0), a, b)
    close(out.item(), np.sum((A - B) / B * w + A ** 2))
    close(ga, w / B + 2 * A)
    close(gb, -w * A / B ** 2)


@pytest.mark.parametrize("shape", [(4,), (1, 4), (3, 1), (1,)])
def test_broadcast_both_orders_with_gradients(shape):
    a, s = rng_values((3, 4), 4), rng_values(shape, 5, 1.0, 2.0)
    w = rng_values((3, 4), 6)
    A, S = a.astype(np.float64), s.astype(np.float64)
    axes = tuple(i for i in range(2) if (S.reshape((1,) * (2 - S.ndim) + S.shape)).shape[i] == 1)

    def reduce_to(g):
        return g.sum(axis=axes, keepdims=True).reshape(s.shape)

    for op, f, df_da, df_ds in [
        (lambda x, y: x + y, lambda x, y: x + y, lambda x, y: 1.0, lambda x, y: 1.0),
        (lambda x, y: x - y, lambda x, y: x - y, lambda x, y: 1.0, lambda x, y: -1.0),
        (lambda x, y: x * y, lambda x, y: x * y, lambda x, y: y, lambda x, y: x),
        (lambda x, y: x / y, lambda x, y: x / y, lambda x, y: 1 / y, lambda x, y: -x / y ** 2),
    ]:
        out, (ga, gs) = grad_of(lambda x, y: belay.sum(op(x, y) * belay.Var(w)), a, s)
        close(out.item(), np.sum(f(A, S) * w))
        close(ga, np.broadcast_to(df_da(A, S) * w, A.shape))
        close(gs, reduce_to(np.broadcast_to(df_ds(A, S) * w, A.shape)))
        # The other order: s op a.
        out, (gs2, ga2) = grad_of(lambda y, x: belay.sum(op(y, x) * belay.Var(w)), s, a)
        close(out.item(), np.sum(f(S, A) * w))
        close(ga2, np.broadcast_to(df_ds(S, A) * w, A.shape))
        close(gs2, reduce_to(np.broadcast_to(df_da(S, A) * w, A.shape)))


def test_numpy_arrays_on_either_side_keep_the_graph():
    a, w = rng_values((2, 3), 18), rng_values((3,), 19, 1.0, 2.0)
    for f, dref in [(lambda x: w * x, w), (lambda x: w - x, -1.0), (lambda x: x / w, 1 / w), (lambda x: w + x, 1.0)]:
        x = leaf(a)
        y = f(x)
        assert isinstance(y, belay.Var)
        belay.sum(y).backward()
        close(x.grad.numpy(), np.broadcast_to(dref, a.shape))


def test_python_scalars_on_both_sides_keep_the_dtype():
    x = belay.Var(np.array([1.0, 2.0, 4.0], np.float16))
    for y, expected in [(x + 1, [2, 3, 5]), (1 + x, [2, 3, 5]), (x - 1, [0, 1, 3]), (1 - x, [0, -1, -3]),
                        (x * 2, [2, 4, 8]), (2 * x, [2, 4, 8]), (x / 2, [0.5, 1, 2]), (2 / x, [2, 1, 0.5]),
                        (-x, [-1, -2, -4]), (x ** 2, [1, 4, 16])]:
        assert y.dtype == belay.float16
        np.testing.assert_array_equal(np.asarray(y, np.float64), expected)


def test_scalar_base_power_and_refused_exponents():
    a = rng_values((2, 3), 20)
    out, (g,) = grad_of(lambda x: belay.sum(2.0 ** x), a)
    close(out.item(), np.sum(2.0 ** a.astype(np.float64)))
    close(g, np.log(2.0) * 2.0 ** a.astype(np.float64))
    x = leaf(a)
    with pytest.raises(TypeError, match="exponent"):
        x ** x
    with pytest.raises(ValueError, match="base"):
        (-2.0) ** x


def test_a_shape_that_cannot_broadcast_is_a_value_error_naming_both():
    a, b = belay.Var(np.zeros((2, 3), np.float32)), belay.Var(np.zeros((2,), np.float32))
    # belay.UsageError: a ValueError (as PyTorch's shape errors are) and a belay.Error.
    with pytest.raises(ValueError, match=r"cannot broadcast fp32\[2\] over fp32\[2, 3\]") as e:
        a - b
    assert isinstance(e.value, belay.Error)
    with pytest.raises(ValueError, match="inner sizes differ"):
        a @ a
    with pytest.raises(ValueError, match="reshape"):
        a.reshape(4, 2)


# ---- elementwise functions

@pytest.mark.parametrize("name,ref,dref,lo,hi", [
    ("exp", np.exp, np.exp, -3, 3),
    ("log", np.log, lambda x: 1 / x, 0.1, 4),
    ("tanh", np.tanh, lambda x: 1 - np.tanh(x) ** 2, -3, 3),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2, -6, 6),
])
def test_unary_functions_and_gradients(name, ref, dref, lo, hi):
    a, w = rng_values((5, 7), 7, lo, hi), rng_values((5, 7), 8)
    A = a.astype(np.float64)
    fn = getattr(belay, name)
    out, (g,) = grad_of(lambda x: belay.sum(fn(x) * belay.Var(w)), a)
    close(out.item(), np.sum(ref(A) * w))
    close(g, dref(A) * w)
    close(getattr(leaf(a), name)().numpy(), ref(A))  # the method form


def gelu_tanh_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def dgelu_tanh_ref(x):
    c = math.sqrt(2 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)


def test_gelu_both_forms_as_torch_names_them():
    """belay.gelu(x) is the erf form, approximate='tanh' GPT-2's (torch.nn.functional.gelu's
    argument); each with its gradient against float64."""
    a, w = rng_values((5, 7), 12, -5, 5), rng_values((5, 7), 13)
    A = a.astype(np.float64)
    out, (g,) = grad_of(lambda x: belay.sum(belay.gelu(x, approximate="tanh") * belay.Var(w)), a)
    close(out.item(), np.sum(gelu_tanh_ref(A) * w))
    close(g, dgelu_tanh_ref(A) * w)
    erf = np.asarray(belay.gelu(leaf(a)), np.float64)
    close(erf, 0.5 * A * (1 + np.vectorize(math.erf)(A / math.sqrt(2))))
    assert np.max(np.abs(erf - gelu_tanh_ref(A))) > 1e-4  # two functions, not one
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        belay.gelu(leaf(a), approximate="fast")


def test_gpt_config_takes_gpt2s_gelu():
    sizes = dict(vocab=64, context=8, width=16, layers=1, heads=2)
    ids = np.random.default_rng(5).integers(0, 64, (2, 8))
    erf, tanh = belay.Gpt(**sizes, seed=4), belay.Gpt(**sizes, gelu="tanh", seed=4)
    assert erf.config.gelu == "erf" and tanh.config.gelu == "tanh" and "gelu='tanh'" in repr(tanh.config)
    # GPT-2's init keeps the MLP's pre-activations near 0, where the two forms agree to FP32:
    # a larger fc weight puts them where the forms differ (up to 4.7e-4 near |x| = 2).
    state = erf.state_dict()
    state["blocks.0.mlp.fc.weight"] = state["blocks.0.mlp.fc.weight"] * 50
    erf.load_state_dict(state)
    tanh.load_state_dict(state)
    a, b = np.asarray(erf(ids)), np.asarray(tanh(ids))
    assert not np.array_equal(a, b) and np.max(np.abs(a - b)) < 1e-3  # the same weights, the other GELU
    again = belay.Gpt(belay.GptConfig(**sizes, gelu="tanh"), seed=4)
    again.load_state_dict(state)
    assert np.array_equal(np.asarray(again(ids)), b)
    with pytest.raises(ValueError, match="gelu must be 'erf' or 'tanh'"):
        belay.GptConfig(gelu="relu")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_unary_and_softmax_in_16_bits_match_float64_of_the_rounded_inputs(dtype):
    t = belay.tensor(rng_values((4, 9), 9, -3, 3), dtype=dtype)
    x = belay.Var(t)
    X = np.asarray(x, np.float64)  # the rounded inputs
    e = np.exp(X - X.max(axis=1, keepdims=True))
    for got, ref in [(belay.exp(x), np.exp(X)), (belay.tanh(x), np.tanh(X)), (x.sigmoid(), 1 / (1 + np.exp(-X))),
                     (belay.softmax(x), e / e.sum(axis=1, keepdims=True))]:
        assert got.dtype == x.dtype
        close(np.asarray(got, np.float64), ref, rtol=4 * EPS[dtype], atol=4 * EPS[dtype] * 1e-3)


# ---- softmax, log_softmax

def test_softmax_and_log_softmax_with_gradients():
    a, w = rng_values((3, 6), 10, -4, 4), rng_values((3, 6), 11)
    A = a.astype(np.float64)
    p = np.exp(A - A.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out, (g,) = grad_of(lambda x: belay.sum(belay.softmax(x) * belay.Var(w)), a)
    close(out.item(), np.sum(p * w))
    close(g, p * (w - np.sum(w * p, axis=1, keepdims=True)))
    out, (g,) = grad_of(lambda x: belay.sum(x.log_softmax() * belay.Var(w)), a)
    close(out.item(), np.sum(np.log(p) * w))
    close(g, w - p * w.sum(axis=1, keepdims=True))


def test_causal_softmax_masks_the_future_and_sends_it_no_gradient():
    a = rng_values((2, 4, 4), 12)
    y = belay.softmax(leaf(a), causal=True)
    A = a.astype(np.float64)
    mask = np.tril(np.ones((4, 4), bool))
    e = np.where(mask, np.exp(A - np.where(mask, A, -np.inf).max(axis=-1, keepdims=True)), 0.0)
    close(y.numpy(), e / e.sum(axis=-1, keepdims=True))
    assert np.all(y.numpy()[:, ~mask] == 0)
    ls = belay.log_softmax(leaf(a), causal=True).numpy()
    assert np.all(np.isneginf(ls[:, ~mask]))
    x = leaf(a)
    belay.sum(belay.softmax(x, causal=True) * belay.Var(rng_values((2, 4, 4), 13))).backward()
    assert np.all(x.grad.numpy()[:, ~mask] == 0)
    with pytest.raises(belay.Error, match=r"\[\.\.\., T, T\]"):
        belay.softmax(leaf(np.zeros((2, 3), np.float32)), causal=True)


# ---- reductions over an axis

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean_over_an_axis_with_gradients(axis, keepdim):
    a = rng_values((2, 3, 4), 14)
    A = a.astype(np.float64)
    for name, ref in [("sum", np.sum), ("mean", np.mean)]:
        y = getattr(belay, name)(leaf(a), axis=axis, keepdim=keepdim)
        r = ref(A, axis=axis, keepdims=keepdim)
        assert y.shape == r.shape and y.dtype == belay.float32
        close(y.numpy(), r)
        w = rng_values(r.shape, 15)
        out, (g,) = grad_of(lambda x: belay.sum(getattr(x, name)(axis, keepdim) * belay.Var(w)), a)
        scale = 1.0 if name == "sum" else 1.0 / a.shape[axis]
        close(g, np.broadcast_to(np.expand_dims(w, axis) if not keepdim else w, a.shape) * scale)
    assert belay.sum(leaf(a)).numpy().shape == (1,)  # no axis: all elements, as before


# ---- shapes: .T, reshape, indexing

def test_transpose_reshape_and_indexing_with_gradients():
    a = rng_values((4, 3), 16)
    A = a.astype(np.float64)
    x = leaf(a)
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    np.testing.assert_array_equal(x.reshape(2, 6).numpy(), a.reshape(2, 6))
    np.testing.assert_array_equal(x.reshape((3, -1)).numpy(), a.reshape(3, -1))
    np.testing.assert_array_equal(x[1].numpy(), a[1])
    np.testing.assert_array_equal(x[-1].numpy(), a[-1])
    np.testing.assert_array_equal(x[1:3].numpy(), a[1:3])
    np.testing.assert_array_equal(x[-2:].numpy(), a[-2:])
    assert [r.shape for r in x] == [(3,)] * 4  # iteration stops at the end (IndexError)
    w = rng_values((3, 4), 17)
    out, (g,) = grad_of(lambda v: belay.sum(v.T * belay.Var(w)) + belay.sum(v[1:3]) + belay.sum(v[0] * v[0]) +
                        belay.sum(v.reshape(12) * belay.Var(np.arange(12, dtype=np.float32))), a)
    expected = w.T.astype(np.float64) + np.arange(12).reshape(4, 3)
    expected[1:3] += 1
    expected[0] += 2 * A[0]
    close(g, expected)
    with pytest.raises(IndexError):
        x[4]
    with pytest.raises(belay.Error, match="step"):
        x[::2]
    with pytest.raises(belay.Error, match="reshape"):
        x.reshape(5, -1)


def test_float_and_numpy_conversion():
    x = belay.Var(np.array([2.5], np.float32))
    assert float(x) == 2.5
    assert float(belay.sum(leaf(np.ones((2, 2), np.float32)))) == 4.0
    with pytest.raises(belay.Error, match="one-element"):
        float(leaf(np.ones(3, np.float32)))
    b = belay.Var(belay.tensor(np.array([[1.0, 2.0]], np.float32), dtype="bf16"))
    arr = np.asarray(b, dtype=np.float32)
    assert arr.dtype == np.float32 and arr.tolist() == [[1.0, 2.0]]


# ---- repr

def test_repr_shows_values_dtype_shape_device():
    t = belay.tensor(np.array([[1.0, 2.5], [-3.0, 0.125]], np.float32), dtype="bf16")
    r = repr(t)
    assert r.startswith("belay.Tensor([[ 1.0000,  2.5000],")
    assert "[-3.0000,  0.1250]]" in r
    assert r.endswith("shape=[2, 2], dtype=bf16, device=cpu)")
    assert str(t) == r
    assert repr(belay.tensor(np.array([1.0, 2.0], np.float32))).startswith("belay.Tensor([1., 2.]")
    v = leaf(np.array([1e-6, 1.0], np.float32))
    assert "1.0000e-06" in repr(v) and "requires_grad=True" in repr(v)
    big = repr(belay.zeros([100, 100]))
    assert "..." in big and big.count("\n") < 10 and "shape=[100, 100]" in big
    # FP16 values print as the numbers they hold, not their bits.
    assert "0.3333" in repr(belay.tensor(np.array([1 / 3], np.float32), dtype="fp16"))
