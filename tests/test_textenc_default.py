"""The shipped default text encoder: files, dim, determinism, semantics, offline loading, agreement with model2vec."""

from __future__ import annotations

import hashlib
import importlib.resources
import re
import socket

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.textenc import TextEncoder
from confluence.textenc.default import MAX_CHARS, StaticEncoder, default_model_dir

MODEL_FILES = ("config.json", "model.safetensors", "modules.json", "tokenizer.json")


@pytest.fixture(scope="module")
def enc() -> StaticEncoder:
    return StaticEncoder()


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_model_files_match_recorded_sha256():
    root = importlib.resources.files("confluence").joinpath("data", "text_encoder")
    recorded = {}
    for line in root.joinpath("sha256sums.txt").read_text().splitlines():
        digest, name = line.split()
        recorded[name] = digest
    assert sorted(recorded) == sorted(MODEL_FILES)
    readme = root.joinpath("README.md").read_text()
    for name in MODEL_FILES:
        actual = hashlib.sha256(root.joinpath(name).read_bytes()).hexdigest()
        assert actual == recorded[name], f"{name} differs from sha256sums.txt"
        assert f"`{actual}`" in readme, f"README.md does not record the sha256 of {name}"


def test_protocol_dim_and_fingerprint(enc):
    assert isinstance(enc, TextEncoder)
    assert enc.dim == 256
    assert re.fullmatch(r"model2vec:confluence-minilm-l6-v2-m2v256:[0-9a-f]{64}", enc.fingerprint)
    weights = (default_model_dir() / "model.safetensors").read_bytes()
    tok = (default_model_dir() / "tokenizer.json").read_bytes()
    assert enc.fingerprint.endswith(hashlib.sha256(weights + tok).hexdigest())


def test_output_shape_dtype_and_norm(enc):
    out = enc.encode(["carrier is UA", "origin is JFK", "a longer sentence about flights and weather"])
    assert out.dtype == np.float32 and out.shape == (3, 256)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert enc.encode([]).shape == (0, 256)
    empty = enc.encode(["", "   "])
    assert not empty.any(), "strings without tokens embed to the zero vector"


def test_deterministic_and_independent_of_batching_and_threads(enc):
    texts = [f"status is value {i} of {i % 7} kinds" for i in range(5000)]
    a = enc.encode(texts)
    b = enc.encode(texts, batch_size=97)
    c = StaticEncoder(num_threads=1).encode(texts)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    single = np.stack([enc.encode([t])[0] for t in texts[:50]])
    assert np.array_equal(single, a[:50])


def test_semantic_sanity(enc):
    dog, puppy, stock, cat, kitten = enc.encode(["dog", "puppy", "stock market", "cat", "kitten"])
    assert _cos(dog, puppy) > _cos(dog, stock) + 0.2
    assert _cos(cat, kitten) > _cos(cat, stock)
    delay, storm, price = enc.encode(["flight delayed by weather", "storm delays departures", "share price rose"])
    assert _cos(delay, storm) > _cos(delay, price)


def test_agrees_with_model2vec_encode(enc):
    from model2vec import StaticModel

    texts = ["carrier is UA", "dest is LAX", "Ünïcödé 東京 text", "an [UNK] token", "x" * 300, "dog"]
    ref = StaticModel.from_pretrained(default_model_dir()).encode(texts).astype(np.float32)
    np.testing.assert_allclose(enc.encode(texts), ref, atol=2e-3)


def test_long_strings_are_truncated(enc):
    head = "the quick brown fox jumps over the lazy dog " * 60
    assert len(head) > MAX_CHARS
    a, b = enc.encode([head, head + "completely different tail words " * 500])
    assert np.array_equal(a, b)


def test_non_string_input_is_named(enc):
    with pytest.raises(ConfluenceError, match=r"text #1 .* not a string"):
        enc.encode(["ok", None])
    with pytest.raises(ConfluenceError, match="single string"):
        enc.encode("dog")


def test_loads_and_encodes_without_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    out = StaticEncoder().encode(["offline works"])
    assert out.shape == (1, 256)


def test_missing_model_dir_is_clear(tmp_path):
    with pytest.raises(ConfluenceError, match="does not exist"):
        StaticEncoder(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfluenceError, match="has no model.safetensors"):
        StaticEncoder(tmp_path / "m")


ASCII_PRINTABLE = "".join(chr(c) for c in range(32, 127))


def test_word_memo_path_equals_whole_string_tokenisation(enc):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    assert enc._memo is not None, "the shipped BERT tokenizer qualifies for the word memo"
    words = st.text(alphabet=ASCII_PRINTABLE, min_size=0, max_size=12)
    texts = st.lists(words, min_size=0, max_size=8).map(" ".join)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(texts, min_size=1, max_size=20))
    def check(batch):
        got = enc._token_ids(batch)
        want = [e.ids for e in enc._tokenizer.encode_batch_fast(batch, add_special_tokens=False)]
        assert got == want

    check()


def test_memo_and_rust_paths_give_identical_vectors():
    with_memo, without = StaticEncoder(), StaticEncoder()
    without._memo = None
    texts = ["carrier is UA", "dest is  LAX!", "tab\tseparated", "naïve café", "[MASK] token", "a" * 600]
    assert np.array_equal(with_memo.encode(texts), without.encode(texts))
    long_ascii = "x, y " * 1000  # > MAX_TOKENS tokens after the MAX_CHARS cut
    assert len(without._token_ids([long_ascii[:2048]])[0]) == 512
    assert len(with_memo._token_ids([long_ascii[:2048]])[0]) == 512
    assert np.array_equal(with_memo.encode([long_ascii]), without.encode([long_ascii]))


def test_memo_is_bounded(monkeypatch):
    import confluence.textenc.default as default

    monkeypatch.setattr(default, "_MEMO_MAX_WORDS", 50)
    enc = StaticEncoder()
    texts = [f"w{i} v{i}" for i in range(200)]
    ref = StaticEncoder()
    ref._memo = None
    for start in range(0, 200, 20):
        np.testing.assert_array_equal(enc.encode(texts[start:start + 20]), ref.encode(texts[start:start + 20]))
        assert len(enc._memo) <= 50
