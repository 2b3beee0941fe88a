"""Running a trained checkpoint on a processed store: load the model, sample sequences for given seeds (or for
arbitrary anchor rows), and return the raw head outputs at each sequence's target cell.

Works on any store whose text-embedding size matches the checkpoint's `d_t`, including databases the checkpoint
never saw (zero-shot): everything schema-specific (column ids, embedding tables, category blocks, statistics) comes
from the store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluence.batch import TrainingBatch
from confluence.errors import ConfluenceError
from confluence.inference.draws import combine_draws
from confluence.model.inputs import DbTables, batch_to_inputs, fitted_max_k
from confluence.model.loss import categorical_logits
from confluence.model.transformer import RelationalTransformer, load_transformer
from confluence.sampler.data import TaskData
from confluence.sampler.sampler import Sampler
from confluence.sampler.stream import BatchStream
from confluence.store import Store
from confluence.stypes import D_TIME
from confluence.targets import kind
from confluence.toolkit.checkpoint import read_checkpoint
from confluence.training.config import RunConfig


@dataclass
class LoadedModel:
    model: RelationalTransformer  # float32 master parameters
    config: RunConfig
    step: int
    path: Path
    # the "database/task" keys the run drew training batches of (its stream position); empty if it records none
    trained_tasks: frozenset[str] = frozenset()

    def trained_on(self, database: str, task: str) -> bool:
        """Whether the run's training batches included `task` of `database` (else answering it is zero-shot)."""
        return f"{database}/{task}" in self.trained_tasks


def load_model(checkpoint: str | Path) -> LoadedModel:
    """Load a checkpoint (a run directory, its `checkpoints/`, or a `step_*` directory) for inference."""
    ck = read_checkpoint(Path(checkpoint))
    if "config" not in ck.meta:
        raise ConfluenceError(f"checkpoint {ck.path}: its meta.json has no training config")
    cfg = RunConfig.from_dict(ck.meta["config"])
    model = load_transformer(cfg.model, ck.path)
    # a run's position says which tasks it drew batches of; a shipped model records them (`confluence.pretrained`)
    drawn = BatchStream.drawn_tasks(ck.meta.get("stream")) | frozenset(ck.meta.get("trained_tasks") or ())
    return LoadedModel(model=model, config=cfg, step=ck.step, path=ck.path, trained_tasks=drawn)


@dataclass
class HeadOutputs:
    """Raw head outputs at the target cell of each requested seed (rows in request order)."""

    null_logit: np.ndarray  # [n]
    num_pred: np.ndarray  # [n] z-score of the target's own statistics
    bool_logit: np.ndarray  # [n]
    ts_pred: np.ndarray  # [n, 15]
    cat_logits: np.ndarray  # [n, K] over the target's category block (K = 0 for other types)


@functools.partial(jax.jit, static_argnames=("max_k",))
def _forward(model: RelationalTransformer, inputs: dict[str, jax.Array], col_tab: jax.Array, cat_tab: jax.Array,
             max_k: int) -> tuple[jax.Array, ...]:
    out = model.at_targets(inputs, col_tab, cat_tab)
    start = inputs["cat_block_start"].astype(jnp.int32)
    count = inputs["cat_count"].astype(jnp.int32)
    logits = categorical_logits(out.cat_preds, model.encoder, cat_tab, start, count, max_k, out.cat_copy,
                                inputs["categorical_embed_ids"])
    return out.null_logits, out.num_preds, out.bool_logits, out.ts_preds, logits


class Predictor:
    """A loaded model bound to one store: head outputs for task seeds or for arbitrary (anchor row, time) pairs.

    Contexts are built the way the checkpoint's training built them (its sampler settings and seed), every task of
    the store served, through the batch stream's ordered passes. With `draws` = n, each seed's answer combines n
    contexts (the sampler's epochs 0..n-1: other labelled rows, other draws of the walk; `combine_draws`); draw 0
    is the one context of `draws` = 1."""

    def __init__(self, loaded: LoadedModel, store: Store | str | Path, *, batch_size: int | None = None,
                 threads: int | None = None, draws: int = 1):
        if draws < 1:
            raise ConfluenceError(f"draws (--draws) must be 1 or more, not {draws}")
        self.draws = int(draws)
        self.loaded = loaded
        self.store = store if isinstance(store, Store) else Store.open(store)
        cfg = loaded.config
        if int(self.store.d_t) != int(cfg.model.d_t):
            raise ConfluenceError(
                f"store {self.store.name!r} has text embeddings of size {self.store.d_t} but the checkpoint expects "
                f"d_t={cfg.model.d_t}; preprocess it with the same text encoder"
            )
        sconf = replace(cfg.sampler, batch_size=batch_size or inference_batch_size(cfg), tasks=None,
                        threads=threads or inference_threads())
        self.stream = BatchStream(Sampler([self.store], sconf, seed=cfg.seed))
        # a store's categorical target may have more categories than any the checkpoint saw: widen the block
        self.max_k = fitted_max_k(cfg.loss.max_k, [self.store])
        tables = DbTables.for_model(self.store, self.max_k, cfg.model)
        self.col_tab, self.cat_tab = jnp.asarray(tables.column_embeddings), jnp.asarray(tables.categorical_embeddings)

    @property
    def batch_size(self) -> int:
        return self.stream.config.batch_size

    def close(self) -> None:
        self.stream.close()

    def seed_ids(self, split: str, task: str) -> np.ndarray:
        return self.stream.sampler.seed_ids(split, task)

    def forward(self, batch: TrainingBatch) -> HeadOutputs:
        """Head outputs of one built batch's valid sequences (the first `seq_valid.sum()`, in batch order); the one
        model call every prediction goes through (the prediction service merges several requests into a batch)."""
        k = int(batch.cat_count) if kind(batch.target_stype).has_classes else 0
        res = _forward(self.loaded.model, batch_to_inputs(batch), self.col_tab, self.cat_tab, max_k=self.max_k)
        m = int(batch.seq_valid.sum())
        nl, num, bl, ts, cl = (np.asarray(r)[:m] for r in res)
        return HeadOutputs(nl, num, bl, ts, cl[:, :k])

    def _run(self, task: str | TaskData, seed_ids: np.ndarray, progress: Any = None,
             context: str = "train") -> HeadOutputs:
        """The seeds' head outputs, `draws` contexts each combined; `progress(m)` per batch of every draw."""
        return combine_draws([self._draw(task, seed_ids, progress, context, epoch) for epoch in range(self.draws)])

    def _draw(self, task: str | TaskData, seed_ids: np.ndarray, progress: Any, context: str,
              epoch: int) -> HeadOutputs:
        data = task if isinstance(task, TaskData) else self.stream.sampler.entry(task).task
        n = len(seed_ids)
        k = int(data.cat_count) if kind(data.target_stype).has_classes else 0
        out = HeadOutputs(np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                          np.zeros((n, D_TIME), np.float32), np.zeros((n, k), np.float32))
        lo = 0
        for batch in self.stream.ordered(task, np.asarray(seed_ids, dtype=np.int64), epoch=epoch, context=context):
            part = self.forward(batch)
            m = len(part.null_logit)
            out.null_logit[lo: lo + m], out.num_pred[lo: lo + m] = part.null_logit, part.num_pred
            out.bool_logit[lo: lo + m], out.ts_pred[lo: lo + m] = part.bool_logit, part.ts_pred
            if k:
                out.cat_logits[lo: lo + m] = part.cat_logits
            lo += m
            if progress is not None:
                progress(m)
        return out

    def task_outputs(self, task: str, seed_ids: np.ndarray, progress: Any = None,
                     context: str = "train") -> HeadOutputs:
        """Head outputs for seeds of a task of the store (seed indices into its task arrays). `context`: the split
        being predicted, whose labels a labelled context may show (`confluence.sampler.labels.CONTEXT_SPLITS`:
        "test" shows train and validation labels; the default "train" only train labels)."""
        return self._run(task, np.asarray(seed_ids, dtype=np.int64), progress, context)

    def anchor_outputs(self, task: str, anchor_rows: np.ndarray, obs_times: np.ndarray,
                       progress: Any = None, context: str = "all") -> HeadOutputs:
        """Head outputs for arbitrary anchor rows (global row indices) and observation times of a task.

        The target is unknown (null); the context follows the same temporal rule as training: no row created after
        the observation time is visible, and a labelled context shows the labels of `context` known by then ("all":
        every label, the default for new anchors; "test": those a test-split evaluation reads; never the anchor's
        own tuple). An anchor that is a seed of the task gets the contexts `task_outputs` gives that seed with the
        same `context` (`Sampler.anchor_task`): the same answer."""
        custom = self.stream.sampler.anchor_task(task, anchor_rows, obs_times)
        return self._run(custom, np.arange(len(anchor_rows), dtype=np.int64), progress, context=context)


# Cells per model call on an accelerator: 512 contexts of 128 cells (`small`), 64 of 1,024 (`base`). On an H100 the
# `small` model ran 5,843 contexts/s at its training batch of 16, 35,200 at 128 and 67,335 at 512; `base` 98 -> 1,727
# from 32 to 128 (docs/design/evaluation.md, "Speed"). On a CPU the training batch is best: 2-core box, 16: 653, 128: 198.
ACCELERATOR_CELLS_PER_CALL = 65_536


def inference_batch_size(cfg: RunConfig) -> int:
    """Sequences per model call when none is asked for: the run's training batch on a CPU (larger batches ran slower
    per context there: the attention scores leave the caches), enough for `ACCELERATOR_CELLS_PER_CALL` cells on a
    GPU or TPU (small batches leave it idle)."""
    if jax.default_backend() == "cpu":
        return int(cfg.sampler.batch_size)
    return max(int(cfg.sampler.batch_size), ACCELERATOR_CELLS_PER_CALL // int(cfg.sampler.seq_len))


def inference_threads() -> int:
    """Sampler threads building contexts beside the model when none are asked for: 1 on a CPU (the model needs the
    cores; the sampler builds 10,000+ contexts/s on one), the CPUs less two on an accelerator (the model answers
    tens of thousands a second there)."""
    if jax.default_backend() == "cpu":
        return 1
    from confluence.toolkit.threads import usable_cpus

    return max(1, usable_cpus() - 2)

