"""Validation as the training loop does it, reusable outside it: a task's weighted mean loss over validation
batches (`batches_loss`), and a `Validator` that scores every validated task of a run (`val/<db>/<task>/loss`,
`heldout/...` and the held-out mean). The loop, early stopping and any script that wants "the loss the run logged"
for a checkpoint call the same code, so their numbers agree."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from confluence.batch import TrainingBatch
from confluence.model.inputs import batch_to_inputs
from confluence.sampler.stream import BatchStream
from confluence.training.step import shard_inputs


def scalar(x: Any) -> float:
    """A replicated (possibly multi-process) scalar as a Python float."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return float(np.asarray(x))


def batches_loss(trainer: Any, params: Any, batches: Iterable[TrainingBatch], tables: tuple[Any, Any],
                 mesh: jax.sharding.Mesh | None = None) -> float | None:
    """The weighted mean of `trainer.eval_loss` over `batches` (each weighted by its target cells), with the
    database's device tables `tables` (column, categorical embeddings); None when no batch has a target."""
    total = weight = 0.0
    for b in batches:
        inputs = batch_to_inputs(b)
        loss, w = trainer.eval_loss(params, shard_inputs(inputs, mesh) if mesh is not None else inputs, *tables)
        w = scalar(w)
        total += scalar(loss) * w
        weight += w
    return total / weight if weight else None


@dataclass(frozen=True)
class ValTask:
    """One validated task: its batch stream, the index of its database there, the database's device tables, the
    log prefix ("val" for a training database, "heldout" for a held-out one) and the stream's task entry."""

    stream: BatchStream
    tables: tuple[Any, Any]
    prefix: str
    entry: Any

    @property
    def key(self) -> str:
        return f"{self.prefix}/{self.entry.key}/loss"


class Validator:
    """The losses of `tasks` on up to `batches` validation batches each (the loop's `loop.val_batches`): what the
    training loop logs, early stopping reads, and scripts recompute for a checkpoint."""

    def __init__(self, trainer: Any, tasks: list[ValTask], batches: int, mesh: jax.sharding.Mesh | None = None):
        self.trainer, self.tasks, self.batches, self.mesh = trainer, tasks, batches, mesh

    def __call__(self, params: Any, status: Callable[[int, ValTask], None] | None = None) -> dict[str, float]:
        """`{task key: loss}` for every task with a validation target, and `heldout/loss`, the mean over the
        held-out tasks; `status(i, task)` is called before each task (a progress line)."""
        res: dict[str, float] = {}
        for i, t in enumerate(self.tasks):
            if status is not None:
                status(i, t)
            batches = t.stream.split("val", t.entry.task.name, t.entry.db_idx, max_batches=self.batches)
            loss = batches_loss(self.trainer, params, batches, t.tables, self.mesh)
            if loss is not None:
                res[t.key] = loss
        held = [v for k, v in res.items() if k.startswith("heldout/")]
        if held:
            res["heldout/loss"] = float(np.mean(held))
        return res
