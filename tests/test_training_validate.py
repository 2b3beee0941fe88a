"""Validation outside the loop (`confluence.training.validate`): a `Validator` built for a finished run's
checkpoint gives exactly the losses the run logged at that step, and `batches_loss` is the weighted mean."""

from __future__ import annotations

import csv

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

from confluence.inference.predictor import load_model
from confluence.model.inputs import DbTables
from confluence.training.loop import open_stream, train
from confluence.training.step import get_trainer
from confluence.training.validate import Validator, ValTask, batches_loss
from tests.fixtures.model import tiny_run_config
from tests.test_sampler_labels import history_store


def test_a_validator_for_a_checkpoint_reproduces_what_the_run_logged(tmp_path):
    cfg = tiny_run_config(sampler={"batch_size": 8, "seq_len": 64, "max_rows": 32, "row_buckets": [8, 32],
                                   "text_buckets": [8, 32]},
                          loop={"max_steps": 6, "ckpt_every": 6, "val_every": 6, "val_batches": 2})
    stores = [history_store(0).path, history_store(1).path]
    with open_stream(stores, cfg) as stream:
        res = train(cfg, stream, tmp_path / "run", progress=False)
    with open(tmp_path / "run" / "scalars.csv") as f:
        logged = {r["tag"]: float(r["value"]) for r in csv.DictReader(f)
                  if r["tag"].startswith("val/") and int(r["step"]) == 6}
    exact = {k: v for k, v in res.val_losses.items() if k.startswith("val/")}
    assert logged and logged == pytest.approx(exact, rel=1e-5)  # the CSV keeps 6 digits

    loaded = load_model(tmp_path / "run")
    trainer = get_trainer(cfg.model, cfg.optim.for_run(cfg.loop.max_steps), cfg.loss)
    params = eqx.filter(loaded.model, eqx.is_inexact_array)  # the loop's params: the model's float arrays
    with open_stream(stores, cfg) as stream:
        tables = [DbTables.for_model(s, cfg.loss.max_k, cfg.model) for s in stream.stores]
        dev = [(jnp.asarray(t.column_embeddings), jnp.asarray(t.categorical_embeddings)) for t in tables]
        tasks = [ValTask(stream, dev[e.db_idx], "val", e) for e in stream.tasks]
        seen = []
        again = Validator(trainer, tasks, cfg.loop.val_batches)(params, lambda i, t: seen.append(t.key))
        assert seen == [t.key for t in tasks]
        assert again == pytest.approx(exact, rel=1e-6)
        # batches_loss is the target-weighted mean over the batches: one batch alone, and no batch at all
        e = stream.tasks[0]
        one = next(iter(stream.split("val", e.task.name, e.db_idx, max_batches=1)))
        assert np.isfinite(batches_loss(trainer, params, [one], dev[e.db_idx]))
        assert batches_loss(trainer, params, [], dev[e.db_idx]) is None
