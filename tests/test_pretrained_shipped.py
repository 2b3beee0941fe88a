"""The model shipped in the package (`pretrained:small`, docs/guide/pretrained.md): it loads by name, its files match
the sha256 its card records, and it evaluates zero-shot on a database it never saw (the bookstore, preprocessed
with the same shipped text encoder it was pretrained with)."""

from __future__ import annotations

import json

import numpy as np

import confluence.pretrained as P
from confluence.evaluation.evaluate import evaluate
from confluence.evaluation.metrics import HEADLINE
from confluence.stypes import SemanticType


def test_the_shipped_model_loads_by_name_and_matches_its_card():
    assert "small" in P.available()
    card = P.card("small")
    path = P.checkpoint_path("pretrained:small")
    for f in P.SHIPPED_FILES:
        assert P.sha256(path / f) == card["sha256"][f]
    assert sum((path / f).stat().st_size for f in P.SHIPPED_FILES) <= P.MAX_BYTES
    for field in ("corpus", "steps", "hardware", "wall_time_s", "command", "results"):
        assert card.get(field), f"the model card lacks {field}"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == card["steps"] and "nycflights13" not in meta["databases"]  # held out of pretraining


def test_the_shipped_model_evaluates_zero_shot_on_the_bookstore(tmp_path):
    from confluence.preprocess.pipeline import preprocess
    from confluence.textenc import load_encoder
    from tests.fixtures.bookstore import bookstore_files

    src, meta = bookstore_files(tmp_path, size="small")
    store = preprocess(src, meta, tmp_path / "store", encoder=load_encoder(None), progress=False)
    res = evaluate("pretrained:small", store, split="test", max_seeds=64)
    scored = [t for t, r in res.items() if "model" in r]
    assert len(scored) >= 6
    for t in scored:
        stype = SemanticType.parse(res[t]["info"]["stype"])
        metric = HEADLINE[stype][0]
        # finite wherever the metric is defined on these rows (AUROC is not when the rows hold one class)
        assert np.isfinite(res[t]["model"][metric]) or not np.isfinite(res[t]["baseline"][metric]), t
        assert res[t]["info"]["trained_on_task"] is False and res[t]["info"]["context_labels"] > 0
