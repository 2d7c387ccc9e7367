"""GPT-2 in and out of belay (apps/run/hf_gpt2.h): belay.import_hf, belay.export_hf and
belay.load_model, the CLI's `belay import` and `belay export --format hf` in library form.

Without torch (CI): a belay GPT exported and imported back is the same model bit for bit, and
every refusal of a file belay cannot represent says so in one line naming the field or tensor
(the files are written here with a plain safetensors writer, as transformers writes them).
With torch and transformers (skipped where missing, never in CI): a random GPT2LMHeadModel as
save_pretrained writes it gives belay the same logits, belay's export loads in from_pretrained
with the same logits, and 20 steps of AdamW with clipping from the imported weights follow
PyTorch's losses step for step.
"""
import json
import math
import pathlib
import struct

import numpy as np
import pytest

import belay

SIZES = dict(vocab=1000, context=64, width=64, layers=2, heads=4)  # the issue's: gelu_new, 2 layers


def write_plain_safetensors(path, tensors, metadata=None):
    """safetensors as the reference writer lays it out (no belay checksums): {name: array}."""
    header, blobs, at = {}, [], 0
    kinds = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.float16): "F16"}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_plain_safetensors(path):
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    kinds = {"F32": np.float32, "I64": np.int64, "F16": np.float16}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=kinds[e["dtype"]]).reshape(e["shape"])
    return out, header.get("__metadata__", {})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A seeded belay GPT (tanh GELU, as GPT-2) exported as a Hugging Face directory."""
    tmp = tmp_path_factory.mktemp("hf")
    model = belay.Gpt(seed=5, gelu="tanh", **SIZES)
    weights = {k: np.array(v) for k, v in model.state_dict().items()}
    settings = {"model": "gpt", "in": "64", "out": "1000", "context": "64", "width": "64", "layers": "2",
                "heads": "4", "gelu": "tanh", "attention": "fused"}
    src = tmp / "belay.safetensors"
    write_plain_safetensors(src, weights, {"format": "belay.model.v1", **{"setting." + k: v for k, v in settings.items()}})
    hf = tmp / "hf"
    belay.export_hf(str(src), str(hf))
    return dict(tmp=tmp, weights=weights, src=src, hf=hf)


def test_export_writes_what_transformers_reads(exported):
    config = json.loads((exported["hf"] / "config.json").read_text())
    assert (config["model_type"], config["activation_function"]) == ("gpt2", "gelu_new")
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["n_positions"], config["vocab_size"]) == \
        (2, 4, 64, 64, 1000)
    assert config["tie_word_embeddings"] is True and config["n_inner"] is None
    tensors, meta = read_plain_safetensors(exported["hf"] / "model.safetensors")
    assert meta["format"] == "pt"  # transformers refuses a safetensors file without it
    assert "lm_head.weight" not in tensors  # tied, as save_pretrained leaves it out
    w = exported["weights"]
    qkv = tensors["transformer.h.1.attn.c_attn.weight"]
    assert qkv.shape == (64, 192)  # Conv1D: [in, out]
    np.testing.assert_array_equal(qkv[:, 64:128], w["blocks.1.attn.k.weight"].T)
    np.testing.assert_array_equal(tensors["transformer.h.0.mlp.c_fc.weight"], w["blocks.0.mlp.fc.weight"].T)
    np.testing.assert_array_equal(tensors["transformer.wte.weight"], w["wte.weight"])


def test_import_of_the_export_is_the_same_model_bit_for_bit(exported):
    out = exported["tmp"] / "back.safetensors"
    assert belay.import_hf(str(exported["hf"]), str(out)) == []
    back = belay.load_model(str(out))
    assert isinstance(back, belay.Gpt)
    c = back.config
    assert (c.vocab, c.context, c.width, c.layers, c.heads, c.gelu) == (1000, 64, 64, 2, 4, "tanh")
    state = {k: np.array(v) for k, v in back.state_dict().items()}
    assert state.keys() == exported["weights"].keys()
    for k, v in exported["weights"].items():
        np.testing.assert_array_equal(state[k], v, err_msg=k)


def test_export_refuses_a_directory_that_holds_a_model(exported):
    with pytest.raises(belay.UsageError, match="already holds config.json: export into a new directory"):
        belay.export_hf(str(exported["src"]), str(exported["hf"]))


def hf_copy(exported, tmp_path, config_change=None, tensors_change=None):
    """A copy of the exported directory with its config or tensors changed."""
    d = tmp_path / "edited"
    d.mkdir()
    config = json.loads((exported["hf"] / "config.json").read_text())
    if config_change:
        config_change(config)
    (d / "config.json").write_text(json.dumps(config))
    tensors, _ = read_plain_safetensors(exported["hf"] / "model.safetensors")
    tensors = dict(tensors)
    if tensors_change:
        tensors_change(tensors)
    write_plain_safetensors(d / "model.safetensors", tensors)
    return d


def set_field(key, value):
    return lambda c: c.__setitem__(key, value)


REFUSALS = [
    ("model_type", set_field("model_type", "llama"), None, r"model_type is \"llama\", belay imports gpt2 only"),
    ("untied config", set_field("tie_word_embeddings", False), None, "tie_word_embeddings false is not supported"),
    ("inverse layer idx", set_field("scale_attn_by_inverse_layer_idx", True), None,
     "scale_attn_by_inverse_layer_idx true is not supported"),
    ("upcast", set_field("reorder_and_upcast_attn", True), None, "reorder_and_upcast_attn true is not supported"),
    ("activation", set_field("activation_function", "relu"), None, "activation_function relu is not supported"),
    ("epsilon", set_field("layer_norm_epsilon", 1e-6), None, "layer_norm_epsilon 1e-06 is not supported"),
    ("n_inner", set_field("n_inner", 100), None, "n_inner 100 is not supported"),
    ("no n_head", lambda c: c.pop("n_head"), None, "has no n_head"),
    ("heads", set_field("n_head", 5), None, "heads"),
    ("shape", set_field("n_embd", 32), None,
     r"tensor 'transformer.wte.weight' has shape \[1000, 64\], config.json's vocab_size and n_embd need \[1000, 32\]"),
    ("vocab", set_field("vocab_size", 999), None, "tensor 'transformer.wte.weight' has shape"),
    ("untied head", None, lambda t: t.__setitem__("lm_head.weight", t["transformer.wte.weight"] + 1),
     "lm_head.weight differs from wte.weight: an untied head"),
    ("missing tensor", None, lambda t: t.pop("transformer.h.1.mlp.c_proj.bias"),
     "has no tensor 'transformer.h.1.mlp.c_proj.bias'"),
    ("extra tensor", None, lambda t: t.__setitem__("transformer.h.0.attn.rotary", np.zeros(3, np.float32)),
     "tensor 'transformer.h.0.attn.rotary' is not part of GPT-2 as belay reads it"),
    ("non-finite", None, lambda t: t.__setitem__("transformer.ln_f.bias", np.full(64, np.nan, np.float32)),
     "tensor 'transformer.ln_f.bias' has a non-finite value"),
]


@pytest.mark.parametrize("what,config_change,tensors_change,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_import_refuses_what_belay_cannot_represent(exported, tmp_path, what, config_change, tensors_change, message):
    d = hf_copy(exported, tmp_path, config_change, tensors_change)
    out = tmp_path / "out.safetensors"
    with pytest.raises(belay.UsageError, match=message) as e:
        belay.import_hf(str(d), str(out))
    assert "\n" not in str(e.value)
    assert not out.exists()  # nothing written


def test_import_refuses_a_truncated_file_and_a_missing_one(exported, tmp_path):
    d = hf_copy(exported, tmp_path)
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(belay.UsageError, match="model.safetensors"):
        belay.import_hf(str(d), str(tmp_path / "out.safetensors"))
    (d / "model.safetensors").unlink()
    with pytest.raises(belay.UsageError, match="has no model.safetensors"):
        belay.import_hf(str(d), str(tmp_path / "out.safetensors"))
    (d / "config.json").write_text("{not json")
    write_plain_safetensors(d / "model.safetensors", {"x": np.zeros(1, np.float32)})
    with pytest.raises(belay.UsageError, match="config.json' is not valid JSON"):
        belay.import_hf(str(d), str(tmp_path / "out.safetensors"))


def test_dropout_is_noted_not_refused(exported, tmp_path):
    d = hf_copy(exported, tmp_path, set_field("resid_pdrop", 0.1))
    notes = belay.import_hf(str(d), str(tmp_path / "out.safetensors"))
    assert notes == ["resid_pdrop 0.1 ignored: belay's GPT has no dropout"]


# ---- against transformers (skipped without it) ------------------------------------------

def tokens_file(path, vocab, n_train, n_heldout, seed):
    rng = np.random.default_rng(seed)
    # a Zipf-like stream with local repeats: something a model can learn in 20 steps
    base = rng.zipf(1.3, size=n_train + n_heldout) % vocab
    write_plain_safetensors(path, {"train": base[:n_train].astype(np.int64), "heldout": base[n_train:].astype(np.int64)},
                            {"tokens.format": "belay.tokens.v1", "tokens.vocab": str(vocab)})


def test_init_takes_the_model_from_the_file(exported, tmp_path):
    """init= of a model file: the kind, sizes and GELU are the file's, not train's defaults."""
    data = tmp_path / "tokens.safetensors"
    tokens_file(data, 1000, 4000, 1000, seed=4)
    ck = tmp_path / "ck.safetensors"
    belay.train(init=str(exported["src"]), data=str(data), steps=2, batch=2, checkpoint=str(ck), quiet=True)
    got = {k: np.array(v) for k, v in belay.load_model(str(ck)).state_dict().items()}
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in exported["weights"].items()}
    again = tmp_path / "again"
    belay.export_hf(str(ck), str(again))
    config = json.loads((again / "config.json").read_text())
    assert (config["n_positions"], config["n_embd"], config["activation_function"]) == (64, 64, "gelu_new")


def test_init_refuses_a_size_that_differs_and_a_longer_context(exported, tmp_path):
    data = tmp_path / "tokens.safetensors"
    tokens_file(data, 1000, 4000, 1000, seed=4)
    for option, message in [("width", "32 differs from the init file's 64"),
                            ("context", "128 differs from the init file's 64")]:
        with pytest.raises(belay.UsageError, match=message):
            belay.train(init=str(exported["src"]), data=str(data), steps=1, batch=2, quiet=True,
                        **{option: 32 if option == "width" else 128})


def test_init_at_a_shorter_context_loads_the_first_positions(exported, tmp_path):
    """context= below the file's n_positions: wpe's first rows (the rows past them are made
    large here, so taking any other rows would change the loss a lot), every other tensor whole;
    the first loss is the loss of that model on the first batch, and the export says the new
    n_positions."""
    weights = dict(exported["weights"])
    wpe = weights["wpe.weight"].copy()
    wpe[16:] = 3.0
    weights["wpe.weight"] = wpe
    src = tmp_path / "model.safetensors"
    settings = {"model": "gpt", "in": "64", "out": "1000", "context": "64", "width": "64", "layers": "2",
                "heads": "4", "gelu": "tanh"}
    write_plain_safetensors(src, weights, {"format": "belay.model.v1", **{"setting." + k: v for k, v in settings.items()}})
    data = tmp_path / "tokens.safetensors"
    tokens_file(data, 1000, 4000, 1000, seed=4)
    ck = tmp_path / "ck16.safetensors"
    rows = belay.train(init=str(src), data=str(data), context=16, steps=1, batch=2, dtype="fp32", seed=2,
                       checkpoint=str(ck), quiet=True)
    model = belay.Gpt(seed=0, gelu="tanh", vocab=1000, context=16, width=64, layers=2, heads=4)
    model.load_state_dict({**weights, "wpe.weight": wpe[:16]})
    x, y = belay.load_tokens(str(data), 16, seed=2).next(2)
    want = float(belay.cross_entropy(model(x), y.reshape(-1)))
    assert abs(rows[0].loss - want) <= 1e-6 * want
    short = tmp_path / "short"
    belay.export_hf(str(ck), str(short))
    assert json.loads((short / "config.json").read_text())["n_positions"] == 16
    assert read_plain_safetensors(short / "model.safetensors")[0]["transformer.wpe.weight"].shape == (16, 64)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (not needed in CI)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (not needed in CI)")
    torch.manual_seed(3)
    config = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # LayerNorms away from 1 and 0, so that a swapped weight and bias would show
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    d = tmp_path_factory.mktemp("hfmodel") / "gpt2"
    model.save_pretrained(str(d))
    return torch, transformers, model, d


def logits_of(torch, model, ids):
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.reshape(-1, 1000).numpy()


def belay_logits(model, ids):
    return np.array(model.eval()(ids.astype(np.float32)).numpy())


def relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_imported_gpt2_gives_transformers_logits(hf_model, tmp_path):
    torch, _, model, d = hf_model
    out = tmp_path / "gpt2.safetensors"
    belay.import_hf(str(d), str(out))
    ids = np.random.default_rng(0).integers(0, 1000, size=(3, 64))
    err = relative(belay_logits(belay.load_model(str(out)), ids), logits_of(torch, model, ids))
    print(f"imported logits: max relative difference {err:.2e}")
    assert err < 1e-5


def test_belay_export_loads_in_from_pretrained_with_the_same_logits(hf_model, tmp_path):
    torch, transformers, model, d = hf_model
    out = tmp_path / "gpt2.safetensors"
    belay.import_hf(str(d), str(out))
    belay.export_hf(str(out), str(tmp_path / "again"))
    again = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "again")).eval()
    ids = np.random.default_rng(1).integers(0, 1000, size=(2, 64))
    ours = belay_logits(belay.load_model(str(out)), ids)
    err = relative(logits_of(torch, again, ids), ours)
    print(f"exported logits: max relative difference {err:.2e}")
    assert err < 1e-5
    np.testing.assert_array_equal(logits_of(torch, again, ids), logits_of(torch, model, ids))


def test_fine_tune_from_imported_weights_follows_pytorch(hf_model, tmp_path):
    torch, transformers, _, d = hf_model
    out = tmp_path / "gpt2.safetensors"
    belay.import_hf(str(d), str(out))
    data = tmp_path / "tokens.safetensors"
    tokens_file(data, 1000, 20000, 4000, seed=9)
    steps, batch, lr, decay, clip = 20, 4, 1e-3, 0.1, 0.5
    rows = belay.train(init=str(out), data=str(data), dtype="fp32", batch=batch, steps=steps, seed=2, lr=lr,
                       weight_decay=decay, clip=clip, schedule="constant", quiet=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(d)).train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() > 1], "weight_decay": decay},
                             {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    windows = belay.load_tokens(str(data), 64, seed=2)
    worst = 0.0
    for s in range(steps):
        x, y = (torch.from_numpy(a).long() for a in windows.next(batch))
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).logits.reshape(-1, 1000), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        worst = max(worst, abs(rows[s].loss - loss.item()) / loss.item())
    print(f"fine-tune: {steps} steps, worst relative loss difference {worst:.2e}")
    assert worst < 1e-4
    assert rows[-1].loss < rows[0].loss
