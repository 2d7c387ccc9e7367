"""The GPT from Python (autograd/gpt.h): belay.Gpt and belay.GptConfig, belay.load_tokens
(TokenDataset) and belay.train(model="gpt"), on a tiny tokens file written here (a few KB of
synthetic byte text, laid out by apps/data/make_text_corpus.py's own writer). No torch needed:
these run in CI (a second or two in all); test_gpt_parity.py compares with PyTorch.
"""
import importlib.util
import math
import pathlib

import numpy as np
import pytest

import belay

ROOT = pathlib.Path(__file__).resolve().parents[3]
SIZES = dict(vocab=256, context=16, width=32, layers=2, heads=4)


def corpus_writer():
    """apps/data/make_text_corpus.py as a module: its write_safetensors lays out a tokens file
    with the CRC-32C checksums belay's reader checks."""
    spec = importlib.util.spec_from_file_location("make_text_corpus", ROOT / "apps/data/make_text_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_text(n, seed):
    """Words from a small vocabulary, in lines: text with structure a model can pick up."""
    rng = np.random.default_rng(seed)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "else", "x", "y"]
    out = []
    while sum(map(len, out)) < n:
        out.append(" ".join(rng.choice(words, 6)) + ":\n")
    return "".join(out).encode()[:n]


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "tiny.safetensors"
    meta = {"tokens.format": "belay.tokens.v1", "tokens.vocab": "256"}
    corpus_writer().write_safetensors(str(path), [("train", synthetic_text(6000, 1)), ("heldout", synthetic_text(1200, 2))],
                                      meta)
    return path


def expected_names(layers):
    names = ["wte.weight", "wpe.weight"]
    for i in range(layers):
        b = f"blocks.{i}."
        names += [b + "ln_1.weight", b + "ln_1.bias"]
        for proj in ("q", "k", "v", "proj"):
            names += [f"{b}attn.{proj}.weight", f"{b}attn.{proj}.bias"]
        names += [b + "ln_2.weight", b + "ln_2.bias"]
        for proj in ("fc", "proj"):
            names += [f"{b}mlp.{proj}.weight", f"{b}mlp.{proj}.bias"]
    return names + ["ln_f.weight", "ln_f.bias"]


def test_gpt_has_the_cpp_names_shapes_and_count():
    model = belay.Gpt(**SIZES, seed=1)
    named = dict(model.named_parameters())
    assert list(named) == expected_names(2)
    d, v, c = SIZES["width"], SIZES["vocab"], SIZES["context"]
    assert named["wte.weight"].shape == (v, d) and named["wpe.weight"].shape == (c, d)
    assert named["blocks.1.attn.q.weight"].shape == (d, d) and named["blocks.1.mlp.fc.weight"].shape == (4 * d, d)
    assert named["blocks.1.mlp.proj.weight"].shape == (d, 4 * d)
    count = v * d + c * d + 2 * (12 * d * d + 13 * d) + 2 * d  # the head is tied: no V x D of its own
    assert model.parameter_count == count == model.config.parameter_count
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == count
    model.config.context = 1000  # a copy: the model keeps its own
    assert model.config.context == c


def test_gpt_init_is_gpt2s_and_set_by_the_seed():
    a = belay.Gpt(**SIZES, seed=1).state_dict()
    b = belay.Gpt(belay.GptConfig(**SIZES), seed=1).state_dict()
    c = belay.Gpt(**SIZES, seed=2).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wte.weight"], c["wte.weight"])
    assert abs(a["wte.weight"].std() - 0.02) < 0.002  # normal(0, 0.02)
    assert abs(a["blocks.0.mlp.proj.weight"].std() - 0.02 / math.sqrt(4)) < 0.002  # scaled by 1/sqrt(2 layers)
    assert np.all(a["blocks.0.ln_1.weight"] == 1) and np.all(a["blocks.0.attn.q.bias"] == 0)


def test_forward_is_causal_and_backward_reaches_every_parameter():
    model = belay.Gpt(**SIZES, seed=3)
    ids = np.random.default_rng(0).integers(0, 256, (2, 12))
    logits = model(ids)
    assert logits.shape == (24, 256)
    # GPT-2's small init: logits near 0, so the first loss is near ln(vocab)
    loss = belay.cross_entropy(logits, np.roll(ids, -1, 1).reshape(-1))
    assert abs(float(loss) - math.log(256)) < 0.05
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and np.all(np.isfinite(p.grad.numpy())), name
        assert np.any(p.grad.numpy() != 0), name
    # A later token changes no earlier position's logits (the mask), but its own
    later = ids.copy()
    later[:, 7] = (later[:, 7] + 1) % 256
    model.eval()
    before, after = model(ids).numpy().reshape(2, 12, 256), model(later).numpy().reshape(2, 12, 256)
    assert np.array_equal(before[:, :7], after[:, :7])
    assert not np.allclose(before[:, 7:], after[:, 7:])


def test_bf16_working_copy_in_eval():
    model = belay.Gpt(**SIZES, seed=3)
    ids = np.arange(32).reshape(2, 16) % 256
    want = model.eval()(ids).numpy()
    model.set_working_dtype("bf16")
    got = model(ids)  # eval mode: under autocast in bf16, the head's product rounded to bf16
    assert got.dtype == belay.bfloat16
    np.testing.assert_allclose(got.value.to("fp32").numpy(), want, atol=4 * 2.0 ** -7 * np.abs(want).max())


def test_load_tokens_gives_windows_of_the_text(tokens_file):
    text = synthetic_text(6000, 1)
    data = belay.load_tokens(tokens_file, context=16, seed=5)
    assert (data.vocab, data.context, data.train_tokens, data.heldout_tokens) == (256, 16, 6000, 1200)
    start = data.position
    x, y = data.next(4)
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])  # y: the next token of each x
    for row, nxt in zip(x, y):
        window = bytes(row.tolist()) + bytes([int(nxt[-1])])
        assert window in text
    data.set_position(start)  # the same seed's position: the same windows again
    again, _ = data.next(4)
    assert np.array_equal(again, x)
    hx, hy = data.heldout_batch(1, 2)
    assert bytes(hx[0].tolist()) == synthetic_text(1200, 2)[16:32]  # window w starts at w * context
    assert data.heldout_windows == (1200 - 1) // 16
    counts = np.bincount(np.frombuffer(text, np.uint8), minlength=256)
    p = counts[counts > 0] / counts.sum()
    assert abs(data.unigram_entropy_nats - float(-(p * np.log(p)).sum())) < 1e-9


def test_train_gpt_is_the_python_loop_and_reports_heldout(tokens_file):
    """belay.train(model="gpt") and a loop over belay.Gpt, belay.load_tokens and SafeStep from
    the same seed: the same init, the same batches, so the same losses bit for bit. (What the
    PyTorch parity test relies on to give torch the trainer's weights and batches.)"""
    opts = dict(context=16, width=32, layers=2, heads=4, seed=7)
    rows = belay.train(model="gpt", data=str(tokens_file), batch=4, steps=6, lr=3e-3, weight_decay=0.1, clip=0.5,
                       schedule="constant", eval_every=3, eval_windows=8, quiet=True, **opts)
    assert isinstance(rows, belay.TrainRows) and len(rows) == 6
    assert [s for s, _ in rows.heldout] == [2, 5] and all(2.0 < loss < 6.0 for _, loss in rows.heldout)
    assert rows.tokens_per_step == 4 * 16
    data = belay.load_tokens(tokens_file, context=16, seed=7)
    assert rows.unigram_entropy == pytest.approx(data.unigram_entropy_nats, rel=1e-12)

    model = belay.Gpt(vocab=data.vocab, **opts)
    opt = belay.AdamW(model, lr=3e-3, weight_decay=0.1)
    step = belay.SafeStep(opt, belay.GradScaler(enabled=False), max_norm=0.5)
    for want in rows:
        x, y = data.next(4)
        got = step.run(lambda k: belay.cross_entropy(model(x), y.reshape(-1)))
        assert (got.loss, got.grad_l2_pre_clip) == (want.loss, want.grad_l2_pre_clip)
    # Not token data: the rows as before, without results of a language model
    plain = belay.train(model="linear", steps=2, quiet=True)
    assert plain.heldout == () and plain.unigram_entropy is None and plain.tokens_per_step == 0


@pytest.mark.parametrize("make, match", [
    (lambda: belay.Gpt(width=30, heads=4), "not a multiple of heads 4"),
    (lambda: belay.Gpt(vocab=0), "vocab must be positive"),
    (lambda: belay.Gpt(**SIZES)(np.zeros((1, 17))), "17 tokens do not fit the context of 16"),
    (lambda: belay.Gpt(**SIZES)(np.zeros(16)), r"token ids \[B, T\]"),
    (lambda: belay.Gpt(**SIZES)(np.full((1, 4), 256)), "256"),
    (lambda: belay.load_tokens("/nonexistent/tokens.safetensors", 16), "tokens.safetensors"),
    (lambda: belay.train(model="gpt", steps=1, quiet=True), "give data FILE"),
    (lambda: belay.train(model="mlp", eval_every=2, steps=1, quiet=True), "eval_every is not an option of model mlp"),
])
def test_bad_gpt_options_raise_a_clear_error(make, match):
    with pytest.raises(belay.Error, match=match):
        make()


def test_bad_gpt_options_on_a_file(tokens_file):
    with pytest.raises(belay.UsageError, match="multiple of"):
        belay.train(model="gpt", data=str(tokens_file), width=30, heads=4, steps=1, quiet=True)
    with pytest.raises(belay.UsageError, match="fewer than a window of context"):
        belay.load_tokens(tokens_file, context=5000)
    with pytest.raises(TypeError, match="train: context"):
        belay.train(model="gpt", data=str(tokens_file), context="long")
    data = belay.load_tokens(tokens_file, context=16, seed=1)
    with pytest.raises(belay.UsageError, match="held-out windows"):
        data.heldout_batch(0, 10_000)
    with pytest.raises(belay.UsageError):
        data.set_position(belay.load_tokens(tokens_file, context=16, seed=2).position)  # another seed's


def test_gpt_checkpoint_loads_and_resumes_bit_for_bit(tokens_file, tmp_path):
    """load_checkpoint(path) rebuilds the Gpt from the shape the settings record, and
    train(resume=path) continues it as if the run had not stopped."""
    opts = dict(model="gpt", data=str(tokens_file), batch=4, context=16, width=32, heads=2, layers=1, seed=4,
                lr=3e-3, schedule="constant", quiet=True)
    whole = belay.train(steps=6, **opts)
    ck = tmp_path / "gpt.safetensors"
    belay.train(steps=4, checkpoint=str(ck), **opts)
    loaded = belay.load_checkpoint(str(ck))
    assert isinstance(loaded.model, belay.Gpt)
    c = loaded.model.config
    assert (c.vocab, c.context, c.width, c.heads, c.layers) == (256, 16, 32, 2, 1)
    rest = belay.train(resume=str(ck), steps=6, data=str(tokens_file), quiet=True)
    assert [r.step for r in rest] == [4, 5]
    assert [r.loss for r in rest] == [r.loss for r in whole[4:]]
