"""Pretraining the link head on many databases (`pretrain_links`, `confluence pretrain-links`): it trains on
every link task of every database, is deterministic, and a fine-tuning run (`train_links(init_from=...)`) starts
from its head as well as its trunk."""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfluenceError
from confluence.inference.predictor import load_model
from confluence.preprocess.pipeline import preprocess
from confluence.store import Store
from confluence.synth.random_db import RandomSpec, write_random
from confluence.toolkit.checkpoint import read_checkpoint
from confluence.training.links import pretrain_links, train_links
from tests.fixtures.bookstore import HashEncoder, write_bookstore, write_metadata
from tests.fixtures.model import tiny_run_config
from tests.test_links import meta_with

SAMPLER = {"batch_size": 8, "seq_len": 96, "max_rows": 32, "row_buckets": [32], "text_buckets": [64]}


def _random_store(root: Path, seed: int) -> Store:
    db = write_random(root / f"db{seed}", RandomSpec(seed=seed, rows=0.3))
    return Store.open(preprocess(db / "raw", db / "random.metadata.json", root / f"store{seed}",
                                 encoder=HashEncoder(8), progress=False))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> list[Store]:
    root = tmp_path_factory.mktemp("link_pretrain")
    return [_random_store(root, seed) for seed in (0, 1)]


@pytest.fixture(scope="module")
def pretrained(stores, tmp_path_factory) -> tuple[Path, list[float]]:
    out = tmp_path_factory.mktemp("link_pre") / "run"
    losses: list[float] = []
    pretrain_links(stores, out, tiny_run_config(sampler=SAMPLER), steps=6, on_step=lambda s, x: losses.append(x))
    return out, losses


def test_pretraining_covers_every_link_task_of_every_database(stores, pretrained):
    out, losses = pretrained
    meta = read_checkpoint(out).meta
    want = [f"{s.name}/{t.name}" for s in stores for t in s.link_tasks]
    assert len(want) == 4 and meta["link_tasks"] == want == meta["trained_tasks"]
    assert meta["databases"] == [s.name for s in stores] and meta["config"]["model"]["link_head"]
    assert len(losses) == 6 and all(np.isfinite(losses))


def test_pretraining_is_deterministic(stores, pretrained, tmp_path):
    out, losses = pretrained
    again: list[float] = []
    pretrain_links(stores, tmp_path / "again", tiny_run_config(sampler=SAMPLER), steps=6,
                   on_step=lambda s, x: again.append(x))
    assert again == losses
    a, b = (jax.tree.leaves(eqx.filter(load_model(p).model, eqx.is_array)) for p in (out, tmp_path / "again"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_fine_tuning_starts_from_the_pretrained_head(pretrained, tmp_path):
    """Fine-tuned on another database's link task at a vanishing rate, the link head is the pretrained one (not a
    fresh initialisation, which differs from it)."""
    pre, _ = pretrained
    shop = Store.open(preprocess(write_bookstore(tmp_path, size="small"), write_metadata(tmp_path, meta_with()),
                                 tmp_path / "shop", encoder=HashEncoder(8), progress=False))
    cfg = tiny_run_config(sampler=SAMPLER, optim={"lr_muon": 1e-9, "lr_adamw": 1e-9})
    tuned = train_links(shop, "customer_books", tmp_path / "tuned", cfg, steps=1, init_from=pre)
    fresh = train_links(shop, "customer_books", tmp_path / "fresh", cfg, steps=1)

    def head(path: Path) -> list[np.ndarray]:
        return [np.asarray(x, np.float32) for x in jax.tree.leaves(eqx.filter(load_model(path).model.link,
                                                                                eqx.is_array))]

    assert all(np.allclose(x, y, atol=1e-5) for x, y in zip(head(tuned), head(pre), strict=True))
    assert not all(np.allclose(x, y, atol=1e-5) for x, y in zip(head(fresh), head(pre), strict=True))


def test_databases_without_link_tasks_are_a_named_error(tmp_path):
    bare = _random_store(tmp_path, 2)  # seed 2 draws no link task
    assert not bare.link_tasks
    with pytest.raises(ConfluenceError, match="none of the 1 database"):
        pretrain_links([bare], tmp_path / "run", tiny_run_config(sampler=SAMPLER), steps=1)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_needs_a_corpus_or_stores(tmp_path):
    res = CliRunner().invoke(app, ["pretrain-links", "--out", str(tmp_path / "run")])
    assert res.exit_code != 0 and "--corpus or --db" in res.output
    both = CliRunner().invoke(app, ["pretrain-links", "--out", str(tmp_path / "run"), "--corpus", str(tmp_path),
                                    "--db", str(tmp_path)])
    assert both.exit_code == 1 and "--corpus or --db" in both.output
    gone = CliRunner().invoke(app, ["pretrain-links", "--out", str(tmp_path / "run"), "--db", str(tmp_path / "no")])
    assert gone.exit_code == 1 and "not a processed store" in gone.output
    assert not (tmp_path / "run").exists()


def test_a_missing_start_checkpoint_is_named_before_anything_is_written(stores, tmp_path):
    for run in (lambda out: pretrain_links(stores, out, tiny_run_config(sampler=SAMPLER), steps=1,
                                           init_from=tmp_path / "nothing"),
                lambda out: train_links(stores[0], stores[0].link_tasks[0].name, out,
                                        tiny_run_config(sampler=SAMPLER), steps=1, init_from=tmp_path / "nothing")):
        with pytest.raises(ConfluenceError, match="no checkpoint found"):
            run(tmp_path / "run")
        assert not (tmp_path / "run").exists()
