"""Pretraining over several databases with held-out ones: the held-out databases' validation losses are logged and
fall as the model learns what transfers; a held-out database that is also trained on is refused."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.toolkit.checkpoint import read_checkpoint
from confluence.training.loop import open_heldout_stream, open_stream, train
from tests.fixtures.model import tiny_run_config
from tests.test_sampler_labels import history_store

SAMPLER = {"batch_size": 8, "seq_len": 64, "max_rows": 32, "row_buckets": [8, 32], "text_buckets": [8, 32],
           "labels": 4, "task_choice": "database_first"}


def _column(path, tag: str) -> list[tuple[int, float]]:
    with open(path) as f:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["tag"] == tag]


def test_pretraining_lowers_the_held_out_databases_loss(tmp_path):
    cfg = tiny_run_config(sampler=SAMPLER, optim={"total_steps": 60},
                          loop={"max_steps": 60, "ckpt_every": 60, "val_every": 20, "val_batches": 2})
    corpus = [history_store(s).path for s in (0, 1, 2)]
    with open_stream(corpus, cfg) as stream, open_heldout_stream([history_store(3).path], cfg) as held:
        res = train(cfg, stream, tmp_path / "run", progress=False, heldout=held)
    assert {"heldout/loss", "heldout/history3/next_sales/loss"} <= set(res.val_losses)
    curve = _column(tmp_path / "run" / "scalars.csv", "heldout/loss")
    assert [s for s, _ in curve] == [0, 20, 40, 60]
    assert curve[-1][1] < 0.8 * curve[0][1], curve  # what it learnt on three databases transfers to a fourth
    assert np.isfinite([v for _, v in curve]).all()


def test_a_held_out_database_that_is_also_trained_on_is_refused(tmp_path):
    cfg = tiny_run_config(sampler=SAMPLER)
    with open_stream([history_store(0).path], cfg) as stream, \
            open_heldout_stream([history_store(0).path], cfg) as held:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text("{}")  # a run already there: --force must not delete it
        with pytest.raises(ConfluenceError, match="history0.*also training"):
            train(cfg, stream, tmp_path / "run", progress=False, heldout=held, force=True)
    assert (tmp_path / "run" / "config.json").read_text() == "{}"


def test_a_run_exported_as_a_pretrained_model_loads_by_name_and_is_checked(tmp_path, monkeypatch):
    """`export_pretrained` ships a run's parameters with a card of sha256; `pretrained:NAME` loads them wherever a
    checkpoint is accepted (evaluate, --init-from); a damaged file or an unknown name is an error saying so."""
    import confluence.pretrained as P
    from confluence.evaluation.evaluate import evaluate
    from confluence.inference.predictor import load_model

    cfg = tiny_run_config(sampler=SAMPLER, loop={"max_steps": 4, "ckpt_every": 4, "val_every": 4})
    with open_stream([history_store(0).path], cfg) as stream:
        train(cfg, stream, tmp_path / "run", progress=False)
    root = tmp_path / "shipped"
    root.mkdir()
    import confluence.toolkit.shipped as S

    monkeypatch.setattr(S, "ROOT", root)  # where pretrained:NAME is resolved
    monkeypatch.setattr(P, "ROOT", root)  # where export ships by default
    from typer.testing import CliRunner

    from confluence.cli.main import app

    info = tmp_path / "info.json"
    info.write_text('{"corpus": "history0", "hardware": "test"}')
    res = CliRunner().invoke(app, ["pretrained", "export", str(tmp_path / "run"), "--name", "tiny", "--info",
                                   str(info), "--to", str(root)])
    assert res.exit_code == 0, res.output
    dest = root / "tiny"
    assert P.available(root) == ["tiny"] and P.card("tiny", root)["step"] == 4
    code = P.card("tiny", root)["code"]  # the code that trained it, from the checkpoint
    assert code == read_checkpoint(tmp_path / "run").meta["code"]
    assert code["version"] and ("working tree that differed" in res.output) == bool(code["dirty"])
    res = CliRunner().invoke(app, ["pretrained", "show", "pretrained:tiny"])
    assert res.exit_code == 0 and '"corpus": "history0"' in res.output and "checked" in res.output
    with pytest.raises(ConfluenceError, match="already exists"):
        P.export_pretrained(tmp_path / "run", "tiny", {}, root=root)
    loaded = load_model("pretrained:tiny")
    direct = load_model(tmp_path / "run")
    for a, b in zip(jax_leaves(loaded.model), jax_leaves(direct.model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.trained_on("history0", "next_sales")  # the card's model knows what it was trained on
    res = evaluate("pretrained:tiny", history_store(1).path, split="val", max_seeds=16)  # another database
    assert np.isfinite(res["next_sales"]["model"]["mae"]) and res["next_sales"]["info"]["trained_on_task"] is False
    with open_stream([history_store(1).path], cfg) as stream:  # fine-tuning starts from the shipped parameters
        tuned = train(cfg, stream, tmp_path / "tuned", progress=False, init_from="pretrained:tiny")
    assert tuned.step == 4
    with pytest.raises(ConfluenceError, match="no pretrained model pretrained:nope; shipped: pretrained:tiny"):
        load_model("pretrained:nope")
    P._verified.cache_clear()
    with open(dest / "state.eqx", "r+b") as f:  # one byte changed
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ConfluenceError, match="state.eqx has sha256 .* damaged"):
        load_model("pretrained:tiny")


def jax_leaves(model):
    import equinox as eqx
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))]


def test_the_pretrain_command_trains_on_a_corpus_and_validates_on_its_held_out_members(tmp_path):
    """`confluence pretrain --corpus DIR`: the corpus's train members are the training databases, its held-out
    members are only validated on; a half-built corpus is refused before anything trains."""
    import json

    from typer.testing import CliRunner

    from confluence.cli.main import app
    from confluence.corpus import build_corpus, open_corpus
    from tests.fixtures.bookstore import HashEncoder

    corpus = build_corpus(tmp_path / "corpus", 4, rows=0.05, heldout=0.25, encoder=HashEncoder(8), progress=False)
    assert len(corpus.heldout_stores) == 1 and len(corpus.train_stores) == 3
    cfg = tiny_run_config(sampler=SAMPLER, loop={"max_steps": 3, "ckpt_every": 3, "val_every": 3})
    recipe = tmp_path / "tiny.json"
    recipe.write_text(json.dumps(cfg.to_dict()))
    res = CliRunner().invoke(app, ["pretrain", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "run"),
                                   "--config", str(recipe), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "on 3 database(s), 1 held out" in res.output and "heldout/loss" in res.output
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("step_*/meta.json")).read_text())
    held = [m for m in open_corpus(tmp_path / "corpus").members if m.role == "heldout"]
    assert len(meta["databases"]) == 3 and len(meta["heldout_databases"]) == 1 and len(held) == 1
    assert not set(meta["databases"]) & set(meta["heldout_databases"])
    import shutil

    shutil.rmtree(corpus.train_stores[0])  # a member missing: refused, naming it
    res = CliRunner().invoke(app, ["pretrain", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "r2"),
                                   "--config", str(recipe), "--no-progress"])
    assert res.exit_code == 1 and "not built" in res.output and Path(corpus.train_stores[0]).name in res.output
    assert not (tmp_path / "r2").exists()
