"""GPT-2's byte-level BPE from Python (belay.BpeTokenizer, apps/text/bpe.h).

Without Hugging Face `tokenizers` (CI): training, encode/decode on any bytes, the files written
and read back, and the tokenizer a tokens file carries. With it (skipped where missing, never in
CI): a BPE of 512 merges trained by belay on the whole corpus (apps/data/make_text_corpus.py's
text), loaded by `tokenizers` from belay's vocab.json + merges.txt and from its tokenizer.json,
gives the same ids on every file of the corpus, and decode(encode(x)) == x on every file.
"""
import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import belay

ROOT = pathlib.Path(__file__).resolve().parents[3]
TEXT = ("def parse(self, value):\n    return self._cache.get(value) or 'défaut'  # ünïcode, 漢字 and ١٢٣\n\n"
        "class Parser:\n    don't = \"it's\"; x = 42\t\n") * 40


def test_train_is_deterministic_and_round_trips_any_bytes():
    a = belay.BpeTokenizer.train(TEXT, 60)
    b = belay.BpeTokenizer.train(TEXT.encode(), 60)
    assert (a.vocab_size, a.merges) == (256 + 60, 60)
    assert a.serialized() == b.serialized()
    ids = a.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) / 2  # the merges compress the text they were trained on
    assert a.decode(ids) == TEXT.encode()
    rng = np.random.default_rng(4)
    for n in (1, 7, 300):
        raw = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()  # mostly invalid UTF-8
        assert a.decode(a.encode(raw)) == raw


def test_zero_merges_are_byte_tokens():
    t = belay.BpeTokenizer.train(TEXT, 0)
    assert t.encode(b"ab\xff") == [97, 98, 255]


def test_files_written_read_back_to_the_same_ids(tmp_path):
    t = belay.BpeTokenizer.train(TEXT, 40)
    t.write_files(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "tokenizer.json", "vocab.json"]
    from_json = belay.BpeTokenizer.from_tokenizer_json(str(tmp_path / "tokenizer.json"))
    from_pair = belay.BpeTokenizer.from_files(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    for other in (from_json, from_pair, belay.BpeTokenizer.from_directory(str(tmp_path))):
        assert other.encode(TEXT) == t.encode(TEXT)


def test_a_bad_file_is_one_line(tmp_path):
    (tmp_path / "vocab.json").write_text("{\"a\": 0, \"b\": 0}")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(belay.UsageError) as e:
        belay.BpeTokenizer.from_files(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert "vocab.json" in str(e.value) and "\n" not in str(e.value)


def test_no_tokenizer_in_a_byte_tokens_file(tmp_path):
    spec = importlib.util.spec_from_file_location("make_text_corpus", ROOT / "apps/data/make_text_corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    path = tmp_path / "bytes.safetensors"
    corpus.write_safetensors(str(path), [("train", b"x" * 100), ("heldout", b"y" * 100)],
                             {"tokens.format": "belay.tokens.v1", "tokens.vocab": "256"})
    assert belay.tokenizer_of(str(path)) is None


# ---- against Hugging Face tokenizers (skipped without it) ----------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The corpus's files (the paths the tokens file lists) and a BPE of 512 merges trained by
    belay on its training split, written as Hugging Face files."""
    pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed (not needed in CI)")
    tmp = tmp_path_factory.mktemp("bpe")
    tokens = tmp / "text.safetensors"
    subprocess.run([sys.executable, str(ROOT / "apps/data/make_text_corpus.py"), "-o", str(tokens)], check=True,
                   capture_output=True)
    raw = tokens.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header["__metadata__"]
    train = raw[8 + n + header["train"]["data_offsets"][0]:8 + n + header["train"]["data_offsets"][1]]
    root = pathlib.Path(meta["corpus.root"])
    files = [root / p for split in ("train.files", "heldout.files") for p in meta[split].splitlines()]
    tokenizer = belay.BpeTokenizer.train(train, 512)
    tokenizer.write_files(str(tmp / "hf"))
    return dict(files=files, tokenizer=tokenizer, hf=tmp / "hf", train=train)


def test_same_ids_as_hugging_face_on_every_file(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    hf = corpus["hf"]
    by_pair = Tokenizer(models.BPE.from_file(str(hf / "vocab.json"), str(hf / "merges.txt")))
    by_pair.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    by_pair.decoder = decoders.ByteLevel()
    by_json = Tokenizer.from_file(str(hf / "tokenizer.json"))
    ours = corpus["tokenizer"]
    compared = 0
    for path in corpus["files"]:
        text = path.read_text(encoding="utf-8")
        ids = ours.encode(text)
        assert ids == by_pair.encode(text).ids, path
        assert ids == by_json.encode(text).ids, path
        assert ours.decode(ids) == text.encode(), path
        compared += len(ids)
    print(f"{len(corpus['files'])} files, {compared} ids: the same as tokenizers'")
    assert compared > 3_000_000 // 3  # the whole corpus, not a sample of it
