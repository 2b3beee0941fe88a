"""The models shipped in the package (`pretrained:small`, the demo's start `pretrained:small-v5`;
docs/guide/pretrained.md): each loads by name, its files match the sha256 its card records, and the model evaluates
zero-shot on a database it never saw (the bookstore, preprocessed with the same shipped text encoder it was
pretrained with)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import confluence.pretrained as P
from confluence.cli.demo_cmds import DEMO_INIT_FROM
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.metrics import HEADLINE
from confluence.stypes import SemanticType
from confluence.training.config import RunConfig


@pytest.mark.parametrize("name", ["small", "small-v5"])
def test_a_shipped_model_loads_by_name_and_matches_its_card(name):
    assert name in P.available()
    card = P.card(name)
    assert card["name"] == name
    path = P.checkpoint_path(f"pretrained:{name}")
    for f in P.SHIPPED_FILES:
        assert P.sha256(path / f) == card["sha256"][f]
    assert sum((path / f).stat().st_size for f in P.SHIPPED_FILES) <= P.MAX_BYTES
    for field in ("corpus", "steps", "hardware", "wall_time_s", "command", "results"):
        assert card.get(field), f"the model card lacks {field}"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == card["steps"] and "nycflights13" not in meta["databases"]  # held out of pretraining


def test_the_shipped_model_never_saw_a_check_database_and_answers_when_next_with_a_wait():
    """pretrained:small (the sixth) was pretrained with the suite's tune databases, never its check databases, and
    reads "when next" times as a wait after the observation time (docs/guide/pretrained.md)."""
    from confluence import devsuite

    checks = set(devsuite.members_with_role("check"))
    meta = json.loads((P.checkpoint_path("pretrained:small") / "meta.json").read_text())
    assert checks and not set(meta["databases"]) & checks and {"f1db", "sakila"} <= set(meta["databases"])
    model = RunConfig.from_dict(meta["config"]).model
    assert model.time_reference and model.time_wait
    assert P.card("small")["results"]["check_databases_zero_shot_beats_trivial"] >= 13


def test_the_demo_fine_tunes_a_shipped_model():
    assert P.is_pretrained(DEMO_INIT_FROM)
    assert P.checkpoint_path(DEMO_INIT_FROM).is_dir()


@pytest.mark.parametrize("name", ["small", "small-v5"])
def test_a_shipped_model_evaluates_zero_shot_on_the_bookstore(tmp_path, name):
    from confluence.preprocess.pipeline import preprocess
    from confluence.textenc import load_encoder
    from tests.fixtures.bookstore import bookstore_files

    src, meta = bookstore_files(tmp_path, size="small")
    store = preprocess(src, meta, tmp_path / "store", encoder=load_encoder(None), progress=False)
    res = evaluate(f"pretrained:{name}", store, split="test", max_seeds=64)
    scored = [t for t, r in res.items() if "model" in r]
    assert len(scored) >= 6
    for t in scored:
        stype = SemanticType.parse(res[t]["info"]["stype"])
        metric = HEADLINE[stype][0]
        # finite wherever the metric is defined on these rows (AUROC is not when the rows hold one class)
        assert np.isfinite(res[t]["model"][metric]) or not np.isfinite(res[t]["baseline"][metric]), t
        assert res[t]["info"]["trained_on_task"] is False and res[t]["info"]["context_labels"] > 0
