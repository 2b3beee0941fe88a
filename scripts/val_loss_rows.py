"""A checkpoint's training-style validation loss per task on two choices of rows.

The loss the training loop logs (`Trainer.eval_loss`, validation contexts) on the split's first `2 x batch_size` val
seeds (what `loop.val_batches = 2` read until 2026-11-25) against the same number drawn across the split
(`sampler.splits.subsample`, seed 0 as the loop draws them now, and seeds 1-5 to show the spread).

Usage: python scripts/val_loss_rows.py RUN STORE   (docs/design/decisions.md, "Validation draws across the split")
"""

from __future__ import annotations

import sys
from dataclasses import replace

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from confluence.inference.predictor import load_model
from confluence.model.inputs import DbTables
from confluence.sampler.sampler import Sampler
from confluence.sampler.splits import subsample
from confluence.sampler.stream import BatchStream
from confluence.store import Store
from confluence.training.step import get_trainer
from confluence.training.validate import batches_loss


def main(run: str, store_path: str) -> None:
    loaded = load_model(run)
    cfg, model = loaded.config, loaded.model
    store = Store.open(store_path)
    stream = BatchStream(Sampler([store], replace(cfg.sampler, tasks=None), seed=cfg.seed))
    tables = DbTables.for_model(store, cfg.loss.max_k, cfg.model)
    col, cat = jnp.asarray(tables.column_embeddings), jnp.asarray(tables.categorical_embeddings)
    n = 2 * cfg.sampler.batch_size
    trainer = get_trainer(cfg.model, cfg.optim.for_run(cfg.loop.max_steps), cfg.loss)  # the loop's eval step
    params = eqx.filter(model, eqx.is_inexact_array)

    def loss(task: str, ids: np.ndarray) -> float:
        return batches_loss(trainer, params, stream.ordered(task, ids, 0, context="val"), (col, cat)) or 0.0

    print(f"{'task':34s} {'first':>8s} {'drawn':>8s}  other draws (seeds 1-5)")
    for e in stream.tasks:
        ids = stream.sampler.seed_ids("val", e.task.name)
        if len(ids):
            others = " ".join(f"{loss(e.task.name, subsample(ids, n, seed=s)):.4f}" for s in range(1, 6))
            print(f"{e.task.name:34s} {loss(e.task.name, ids[:n]):8.4f} {loss(e.task.name, subsample(ids, n)):8.4f}"
                  f"  {others}")
    stream.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
