"""Running a trained checkpoint on a processed store: load the model, sample sequences for given seeds (or for
arbitrary anchor rows), and return the raw head outputs at each sequence's target cell.

Works on any store whose text-embedding size matches the checkpoint's `d_t`, including databases the checkpoint
never saw (zero-shot): everything schema-specific (column ids, embedding tables, category blocks, statistics) comes
from the store.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from confluence.errors import ConfluenceError
from confluence.model.inputs import batch_to_inputs, bucket_size
from confluence.model.loss import categorical_logits
from confluence.model.transformer import RelationalTransformer
from confluence.sampler.config import SamplerConfig, SplitConfig
from confluence.sampler.data import TaskData, obs_time_cells
from confluence.sampler.sampler import Sampler
from confluence.store import Store
from confluence.stypes import D_TIME, SemanticType
from confluence.training.checkpoint import load_state, read_meta
from confluence.training.presets import TrainConfig


@dataclass
class LoadedModel:
    model: RelationalTransformer  # float32 master parameters
    config: TrainConfig
    step: int
    path: Path


def load_model(checkpoint: str | Path) -> LoadedModel:
    """Load a checkpoint (a run directory, its `checkpoints/`, or a `step_*` directory) for inference."""
    ck = read_meta(Path(checkpoint))
    try:
        cfg = TrainConfig.from_dict(ck.meta["config"])
    except KeyError:
        raise ConfluenceError(f"checkpoint {ck.path}: its meta.json has no training config") from None
    model = RelationalTransformer(cfg.model, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    params, _ = load_state(ck.path, params)
    return LoadedModel(model=eqx.combine(params, static), config=cfg, step=ck.step, path=ck.path)


@dataclass
class HeadOutputs:
    """Raw head outputs at the target cell of each requested seed (rows in request order)."""

    null_logit: np.ndarray  # [n]
    num_pred: np.ndarray  # [n] z-score of the target's own statistics
    bool_logit: np.ndarray  # [n]
    ts_pred: np.ndarray  # [n, 15]
    cat_logits: np.ndarray  # [n, K] over the target's category block (K = 0 for other types)


def sampler_config(cfg: TrainConfig, batch_size: int | None = None, threads: int = 1) -> SamplerConfig:
    """The sampler settings a checkpoint was trained with (same split, sequence length, width), for one process."""
    extra = dict(cfg.sampler)
    split = extra.pop("split", None)
    if isinstance(split, dict):
        if "fractions" in split:
            split["fractions"] = tuple(split["fractions"])
        split = SplitConfig(**split)
    fields = {"batch_size": batch_size or cfg.batch_size, "seq_len": cfg.seq_len, "max_rows": cfg.max_rows,
              "seed": cfg.seed, "threads": threads, **extra}
    fields.pop("rank", None)
    fields.pop("world_size", None)
    if split is not None:
        fields["split"] = split
    try:
        return SamplerConfig(**fields)
    except TypeError as exc:
        raise ConfluenceError(f"checkpoint sampler settings: {exc}") from exc


@functools.partial(jax.jit, static_argnames=("max_k",))
def _forward(model: RelationalTransformer, inputs: dict[str, jax.Array], col_tab: jax.Array, cat_tab: jax.Array,
             max_k: int) -> tuple[jax.Array, ...]:
    out = model(inputs, col_tab, cat_tab)
    b = inputs["is_target"].shape[0]
    t = jnp.argmax(inputs["is_target"], axis=1)
    bidx = jnp.arange(b)
    start = inputs["cat_block_start"].astype(jnp.int32)
    count = inputs["cat_count"].astype(jnp.int32)
    logits = categorical_logits(out.cat_preds[bidx, t], model.encoder, cat_tab, start, count, max_k)
    return (out.null_logits[bidx, t], out.num_preds[bidx, t], out.bool_logits[bidx, t], out.ts_preds[bidx, t],
            logits)


class Predictor:
    """A loaded model bound to one store: head outputs for task seeds or for arbitrary (anchor row, time) pairs."""

    def __init__(self, loaded: LoadedModel, store: Store | str | Path, *, batch_size: int | None = None,
                 threads: int = 1):
        self.loaded = loaded
        self.store = store if isinstance(store, Store) else Store.open(store)
        cfg = loaded.config
        if int(self.store.d_t) != int(cfg.model.d_t):
            raise ConfluenceError(
                f"store {self.store.name!r} has text embeddings of size {self.store.d_t} but the checkpoint expects "
                f"d_t={cfg.model.d_t}; preprocess it with the same text encoder"
            )
        self.sampler = Sampler([self.store], sampler_config(cfg, batch_size, threads))
        k_targets = [int(t.cat_count) for t in self.store.tasks
                     if int(t.target_stype) == int(SemanticType.CATEGORICAL)]
        self.max_k = bucket_size(max([cfg.loss.max_k, *k_targets]), minimum=cfg.loss.max_k)
        col = np.asarray(self.store.column_embeddings)
        cat = np.asarray(self.store.categorical_embeddings)
        col_pad = np.zeros((bucket_size(col.shape[0]), col.shape[1]), np.float16)
        col_pad[: col.shape[0]] = col
        cat_pad = np.zeros((bucket_size(cat.shape[0] + self.max_k), col.shape[1]), np.float16)
        cat_pad[: cat.shape[0]] = cat
        self.col_tab, self.cat_tab = jnp.asarray(col_pad), jnp.asarray(cat_pad)

    @property
    def batch_size(self) -> int:
        return self.sampler.config.batch_size

    def close(self) -> None:
        self.sampler.close()

    def seed_ids(self, split: str, task: str) -> np.ndarray:
        return self.sampler.seed_ids(split, task)

    def _run(self, task: TaskData, seed_ids: np.ndarray, progress: Any = None) -> HeadOutputs:
        n = len(seed_ids)
        k = int(task.cat_count) if int(task.target_stype) == int(SemanticType.CATEGORICAL) else 0
        out = HeadOutputs(np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                          np.zeros((n, D_TIME), np.float32), np.zeros((n, k), np.float32))
        builder = self.sampler.builders[0]
        bs = self.batch_size
        for lo in range(0, n, bs):
            ids = np.asarray(seed_ids[lo: lo + bs], dtype=np.int64)
            batch = builder.build(task, ids).batch
            res = _forward(self.loaded.model, batch_to_inputs(batch), self.col_tab, self.cat_tab, max_k=self.max_k)
            m = len(ids)
            nl, num, bl, ts, cl = (np.asarray(r)[:m] for r in res)
            out.null_logit[lo: lo + m], out.num_pred[lo: lo + m], out.bool_logit[lo: lo + m] = nl, num, bl
            out.ts_pred[lo: lo + m] = ts
            if k:
                out.cat_logits[lo: lo + m] = cl[:, :k]
            if progress is not None:
                progress(m)
        return out

    def task_outputs(self, task: str, seed_ids: np.ndarray, progress: Any = None) -> HeadOutputs:
        """Head outputs for seeds of a task of the store (seed indices into its task arrays)."""
        return self._run(self.sampler.entry(task).task, np.asarray(seed_ids, dtype=np.int64), progress)

    def anchor_outputs(self, task: str, anchor_rows: np.ndarray, obs_times: np.ndarray,
                       progress: Any = None) -> HeadOutputs:
        """Head outputs for arbitrary anchor rows (global row indices) and observation times of a task.

        The target is unknown (null); the context follows the same temporal rule as training: no row created after
        the observation time is visible."""
        base = self.sampler.entry(task).task
        n = len(anchor_rows)
        if n == 0:
            return self._run(base, np.zeros(0, np.int64))
        custom = dataclasses.replace(
            base,
            anchor_row=np.asarray(anchor_rows, dtype=np.int64),
            obs_time=np.asarray(obs_times, dtype=np.int64),
            tgt_f32=np.zeros(n if int(base.target_stype) == int(SemanticType.NUMERICAL) else 1, np.float32),
            tgt_ts=np.zeros((n, D_TIME) if int(base.target_stype) == int(SemanticType.TIMESTAMP) else (1, D_TIME),
                            np.float32),
            tgt_u32=np.full(n if int(base.target_stype) == int(SemanticType.CATEGORICAL) else 1,
                            base.cat_block_start, np.uint32),
            tgt_bits=np.zeros((n + 7) // 8 if int(base.target_stype) == int(SemanticType.BOOLEAN) else 1, np.uint8),
            tgt_valid=np.zeros((n + 7) // 8, np.uint8),
            obs_ts=obs_time_cells(self.store, base.obs_col, np.asarray(obs_times, dtype=np.int64)),
        )
        return self._run(custom, np.arange(n, dtype=np.int64), progress)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        return x
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
