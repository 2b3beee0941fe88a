"""Pretraining over several databases with held-out ones: the held-out databases' validation losses are logged and
fall as the model learns what transfers; a held-out database that is also trained on is refused."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from confluence.errors import ConfluenceError
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
        with pytest.raises(ConfluenceError, match="history0.*also training"):
            train(cfg, stream, tmp_path / "run", progress=False, heldout=held)
