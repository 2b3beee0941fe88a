"""Training end to end on a tiny corpus: the loss decreases, checkpoint -> resume continues identically, several
devices, the trained encoder as a frozen TextEncoder, and a processed store built with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import confluence
from confluence.errors import ConfluenceError
from confluence.textenc.base import TextEncoder
from confluence.textmodel.config import load_text_config
from confluence.textmodel.data import prepare_corpus, read_meta
from confluence.textmodel.encoder import load_lejepa_encoder
from confluence.textmodel.train import train_text
from confluence.toolkit.checkpoint import STATE_FILE, latest_checkpoint
from confluence.toolkit.logs import read_scalars
from tests.fixtures.text import tiny_sentences, write_tiny_corpus

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 40


def _cfg(data: Path, **kw):
    m = read_meta(data)
    return load_text_config("text-tiny", m.vocab_size, m.max_seq_len,
                            {"max_train_steps": STEPS, "optim": {"lr_muon": 0.02, "lr_adamw": 3e-3}, **kw})


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("txt")
    corpus = write_tiny_corpus(root / "corpus", n=500)
    prepare_corpus(corpus, root / "data", max_seq_len=16, vocab_size=300)
    return root / "data"


@pytest.fixture(scope="module")
def run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    train_text(data, out, _cfg(data))
    return out


def _metrics(run: Path) -> list[dict[str, float]]:
    """One dict per logged step: the `train/` scalars of run/scalars.csv by term name, and the step."""
    rows: dict[int, dict[str, float]] = {}
    for tag, points in read_scalars(run / "scalars.csv").items():
        if tag.startswith("train/"):
            for step, v in points:
                rows.setdefault(step, {"step": float(step)})[tag.split("/", 1)[1]] = v
    return [rows[k] for k in sorted(rows)]


def test_loss_decreases_on_tiny_corpus(run: Path) -> None:
    rows = _metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    first = np.mean([r["total"] for r in rows[:5]])
    last = np.mean([r["total"] for r in rows[-5:]])
    assert last < 0.85 * first, (first, last)
    dec_first, dec_last = np.mean([r["decoder"] for r in rows[:5]]), np.mean([r["decoder"] for r in rows[-5:]])
    assert dec_last < dec_first - 0.5
    for r in rows:
        assert all(np.isfinite(v) for v in r.values())
    assert latest_checkpoint(run).name == f"step_{STEPS:08d}"


def test_resume_continues_identically(run: Path, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    cfg = _cfg(data)
    first = train_text(data, out, cfg, stop_after=STEPS // 2)
    assert first.steps == STEPS // 2 and latest_checkpoint(out).name == f"step_{STEPS // 2:08d}"
    second = train_text(data, out, cfg)
    assert second.steps == STEPS
    a = (latest_checkpoint(run) / STATE_FILE).read_bytes()  # parameters and optimizer state
    b = (latest_checkpoint(out) / STATE_FILE).read_bytes()
    assert a == b, "resumed run ended with a different state"
    ra, rb = _metrics(run), _metrics(out)
    assert [r["step"] for r in rb] == [r["step"] for r in ra]
    for x, y in zip(ra, rb, strict=True):
        assert x["total"] == y["total"]
    # another configuration in the same run directory is refused
    with pytest.raises(ConfluenceError, match="another configuration"):
        train_text(data, out, cfg.replace(sigreg_weight=0.5))


def test_ctrl_c_checkpoints_the_step_in_flight_and_resumes_identically(run: Path, data: Path, tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) ends training after the step in flight with a checkpoint of it; resuming ends where an
    uninterrupted run ends."""
    out = tmp_path / "interrupted"
    cfg = _cfg(data)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            train_text(data, out, cfg, progress=lambda row: os.kill(os.getpid(), signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert latest_checkpoint(out).name == f"step_{1:08d}"  # the first step (progress reports it), nothing later
    train_text(data, out, cfg)
    assert (latest_checkpoint(run) / STATE_FILE).read_bytes() == (latest_checkpoint(out) / STATE_FILE).read_bytes()


def test_trained_encoder_is_a_frozen_text_encoder(run: Path) -> None:
    enc = load_lejepa_encoder(run)
    assert isinstance(enc, TextEncoder)
    assert enc.dim == 32 and enc.fingerprint.startswith("lejepa:")
    texts = tiny_sentences(20, seed=9) + ["", "x" * 500]
    a = enc.encode(texts, batch_size=8)
    assert a.shape == (22, 32) and a.dtype == np.float32 and np.isfinite(a).all()
    b = enc.encode(texts, batch_size=8)
    np.testing.assert_array_equal(a, b)
    single = enc.encode(texts[3:4])
    np.testing.assert_allclose(single[0], a[3], atol=1e-5)
    # not collapsed: distinct texts get distinct embeddings
    assert np.linalg.matrix_rank(a[:20], tol=1e-3) > 5
    # the checkpoint directory is self-contained (config + tokenizer) and gives the same fingerprint
    ckpt = latest_checkpoint(run)
    assert {p.name for p in ckpt.iterdir()} >= {STATE_FILE, "meta.json", "tokenizer.json"}
    assert json.loads((ckpt / "meta.json").read_text())["code"]["version"] == confluence.__version__
    assert load_lejepa_encoder(ckpt).fingerprint == enc.fingerprint
    with pytest.raises(ConfluenceError, match="neither"):
        load_lejepa_encoder(run / "checkpoints")


def test_store_built_with_trained_encoder(run: Path, tmp_path: Path) -> None:
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from tests.fixtures.bookstore import bookstore_files

    src, meta = bookstore_files(tmp_path)
    enc = load_lejepa_encoder(run)
    # through the registry spec preprocessing accepts (confluence.textenc.registry -> load_lejepa_encoder)
    out = preprocess(src, meta, tmp_path / "store", text_encoder=f"lejepa:{run}", progress=False)
    store = Store.open(out)
    assert store.d_t == enc.dim
    assert store.meta["text_encoder"]["fingerprint"] == enc.fingerprint
    col_texts = [c["text"] for c in store.meta["columns"]]
    expect = enc.encode(col_texts).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(store.column_embeddings), expect)
    # and the store's text values (column texts, categories, raw text cells via the source) as a corpus
    n_text_cells = sum(c["stats"]["distinct"] for t in store.meta["tables"] for c in t["columns"]
                       if c["stype"] == "text")
    m1 = prepare_corpus(out, tmp_path / "from_store", max_seq_len=16, vocab_size=280)
    m2 = prepare_corpus(out, tmp_path / "from_store_src", source=src, max_seq_len=16, vocab_size=280)
    assert m1.num_documents >= len(col_texts) and m2.num_documents == m1.num_documents + n_text_cells


def test_cli_train_on_four_devices_float16_rope_causal_and_embed(tmp_path: Path) -> None:
    """The CLI end to end; training runs data-parallel over 4 host devices with float16 compute, 2 micro-batches
    per step, RoPE and causal attention."""
    corpus = write_tiny_corpus(tmp_path / "c", n=120)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    cli = [sys.executable, "-m", "confluence.cli.main", "text"]
    r = subprocess.run(cli + ["prepare", str(corpus), "--out", str(tmp_path / "d"), "--max-seq-len", "16",
                              "--vocab-size", "280"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cli + ["train", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "r"), "--config",
                              "text-tiny", "--max-train-steps", "2", "--set", "model.attn_type=rope", "--set",
                              "model.causal=true", "--set", "compute_dtype=float16", "--set", "grad_accum=2"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trained to step 2" in r.stdout
    rows = _metrics(tmp_path / "r")
    assert len(rows) == 2 and all(np.isfinite(x["total"]) for x in rows)
    r = subprocess.run(cli + ["embed", str(tmp_path / "r"), "the flight departs", "--out", str(tmp_path / "e.npy")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "e.npy").shape == (1, 32)
    r = subprocess.run(cli + ["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "r2")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "text prepare" in r.stderr and "Traceback" not in r.stderr
