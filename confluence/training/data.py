"""What the training loop reads batches from: a `BatchSource` (one or several databases, their tasks, their
GPU-resident tables, and one deterministic, resumable batch stream per (database, task))."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.batch import TrainingBatch
from confluence.stypes import SemanticType
from confluence.training.synthetic import SyntheticDatabase


@dataclass(frozen=True)
class TaskRef:
    """A (database, task) stream. `key` names it in logs and in the pipeline position."""

    db_idx: int
    task_idx: int
    db_name: str
    task_name: str
    target_stype: SemanticType

    @property
    def key(self) -> str:
        return f"{self.db_name}/{self.task_name}"


@dataclass(frozen=True)
class DbInfo:
    name: str
    column_embeddings: np.ndarray  # f16 [C, D_t]
    categorical_embeddings: np.ndarray  # f16 [Vc, D_t]
    max_k: int


@runtime_checkable
class BatchSource(Protocol):
    databases: list[DbInfo]
    tasks: list[TaskRef]

    def train_batch(self, task: TaskRef) -> TrainingBatch:
        """The next training batch of this stream (advances the stream's position)."""
        ...

    def val_batch(self, task: TaskRef, index: int) -> TrainingBatch | None:
        """The `index`-th validation batch of this task (None when the split has fewer batches)."""
        ...

    def position(self) -> dict[str, Any]:
        """JSON-able pipeline position (epoch + batch index per stream): enough to continue the same sequence."""
        ...

    def restore(self, position: dict[str, Any]) -> None:
        ...

    def close(self) -> None:
        ...


class SyntheticSource:
    """Synthetic databases (`SyntheticDatabase`); batch `i` of a stream is a pure function of (db, task, i)."""

    def __init__(self, num_databases: int = 1, *, d_t: int, batch_size: int, seq_len: int, max_rows: int,
                 seed: int = 0, batches_per_epoch: int = 1000):
        self.dbs = [SyntheticDatabase(seed=seed + i, d_t=d_t, name=f"synthetic{i}") for i in range(num_databases)]
        self.databases = [DbInfo(d.name, d.column_embeddings, d.categorical_embeddings, d.max_k) for d in self.dbs]
        self.tasks = [TaskRef(i, j, d.name, t.name, t.target_stype) for i, d in enumerate(self.dbs)
                      for j, t in enumerate(d.tasks)]
        self.batch_size, self.seq_len, self.max_rows = batch_size, seq_len, max_rows
        self.batches_per_epoch = batches_per_epoch
        self._pos: dict[str, list[int]] = {t.key: [0, 0] for t in self.tasks}

    def train_batch(self, task: TaskRef) -> TrainingBatch:
        epoch, idx = self._pos[task.key]
        batch = self.dbs[task.db_idx].batch(task.task_idx, self.batch_size, self.seq_len, self.max_rows,
                                            seed=(0, epoch, idx), db_idx=task.db_idx)
        idx += 1
        self._pos[task.key] = [epoch + idx // self.batches_per_epoch, idx % self.batches_per_epoch]
        return batch

    def val_batch(self, task: TaskRef, index: int) -> TrainingBatch | None:
        return self.dbs[task.db_idx].batch(task.task_idx, self.batch_size, self.seq_len, self.max_rows,
                                           seed=(1, 0, index), db_idx=task.db_idx)

    def position(self) -> dict[str, Any]:
        return {k: {"epoch": e, "batch": b} for k, (e, b) in self._pos.items()}

    def restore(self, position: dict[str, Any]) -> None:
        missing = sorted(set(self._pos) - set(position))
        if missing:
            raise ValueError(f"pipeline position lacks stream(s) {missing}")
        self._pos = {k: [int(position[k]["epoch"]), int(position[k]["batch"])] for k in self._pos}

    def close(self) -> None:
        return None


class StoreSource:
    """Processed stores through `confluence.sampler.Sampler`. Each (database, task) stream walks its train seeds
    in a per-epoch shuffle (seeded by (seed, stream, epoch)); its position is (epoch, batch), so a resumed run
    continues the exact same batch sequence. Validation batches are the val split's seeds in order."""

    def __init__(self, sampler: Any, stores: list[Any], batch_size: int, seed: int = 0):
        self.sampler, self.batch_size, self.seed = sampler, batch_size, seed
        # The loss pads only a TARGET's category block to max_K (see target_max_k).
        self.databases = [DbInfo(s.name, np.asarray(s.column_embeddings), np.asarray(s.categorical_embeddings),
                                 target_max_k(s)) for s in stores]
        self.tasks = [TaskRef(e.db_idx, e.task.index, e.db_name, e.task.name, SemanticType(int(e.task.target_stype)))
                      for e in sampler.entries]
        self._train_ids = {t.key: sampler.seed_ids("train", t.task_name, t.db_idx) for t in self.tasks}
        self._val_ids = {t.key: sampler.seed_ids("val", t.task_name, t.db_idx) for t in self.tasks}
        empty = [k for k, v in self._train_ids.items() if v.shape[0] == 0]
        if empty:
            raise ConfluenceError(f"task(s) {empty} have no training seeds in this shard; exclude them or re-split")
        self._pos = {t.key: [0, 0] for t in self.tasks}
        self._order_cache: dict[tuple[str, int], np.ndarray] = {}

    def _order(self, key: str, epoch: int) -> np.ndarray:
        if (key, epoch) not in self._order_cache:
            ids = self._train_ids[key]
            rng = np.random.default_rng([self.seed, epoch, *key.encode()])
            self._order_cache = {(key2, e): v for (key2, e), v in self._order_cache.items() if key2 != key}
            self._order_cache[(key, epoch)] = ids[rng.permutation(ids.shape[0])]
        return self._order_cache[(key, epoch)]

    def train_batch(self, task: TaskRef) -> TrainingBatch:
        epoch, idx = self._pos[task.key]
        n = self._train_ids[task.key].shape[0]
        per_epoch = max(n // self.batch_size, 1)
        order = self._order(task.key, epoch)
        seeds = np.resize(order, max(self.batch_size, n))[idx * self.batch_size : (idx + 1) * self.batch_size]
        idx += 1
        self._pos[task.key] = [epoch + idx // per_epoch, idx % per_epoch]
        return self.sampler.batch_for_seeds(task.task_name, seeds, task.db_idx, epoch)

    def val_batch(self, task: TaskRef, index: int) -> TrainingBatch | None:
        ids = self._val_ids[task.key][index * self.batch_size : (index + 1) * self.batch_size]
        if ids.shape[0] == 0:
            return None
        return self.sampler.batch_for_seeds(task.task_name, ids, task.db_idx, 0)

    def position(self) -> dict[str, Any]:
        return {k: {"epoch": e, "batch": b} for k, (e, b) in self._pos.items()}

    def restore(self, position: dict[str, Any]) -> None:
        missing = sorted(set(self._pos) - set(position))
        if missing:
            raise ConfluenceError(f"checkpoint pipeline position lacks stream(s) {missing}: other databases/tasks?")
        self._pos = {k: [int(position[k]["epoch"]), int(position[k]["batch"])] for k in self._pos}

    def close(self) -> None:
        self.sampler.close()


def target_max_k(store: Any) -> int:
    """Largest K among the store's categorical *task targets*: the static width the loss pads to.

    (The store's `max_k` also counts categorical input columns, which never need a loss over their block.)"""
    return max((int(t.cat_count) for t in store.tasks if int(t.target_stype) == int(SemanticType.CATEGORICAL)),
               default=0)


def open_store_source(paths: list[Path], cfg: Any) -> StoreSource:
    """Open processed stores and a sampler configured from the training config (`cfg.sampler` overrides)."""
    try:
        from confluence.sampler.config import SamplerConfig
        from confluence.sampler.sampler import Sampler
    except ImportError as exc:
        raise ConfluenceError(
            "--db needs the context-window sampler (confluence.sampler.Sampler), which this build lacks; "
            "use --synthetic N to train on synthetic databases"
        ) from exc
    from confluence.store import Store

    stores = [Store.open(p) for p in paths]
    import jax

    local_b = cfg.batch_size // jax.process_count()
    fields = {"batch_size": local_b, "seq_len": cfg.seq_len, "max_rows": cfg.max_rows, "seed": cfg.seed,
              "rank": jax.process_index(), "world_size": jax.process_count(), **cfg.sampler}
    try:
        sconf = SamplerConfig(**fields)
    except TypeError as exc:
        raise ConfluenceError(f"training config [sampler]: {exc}") from exc
    sampler = Sampler(stores, sconf)
    _check_task_keys(sampler, sconf)
    return StoreSource(sampler, stores, local_b, cfg.seed)


def _check_task_keys(sampler: Any, sconf: Any) -> None:
    """Per-task sampler settings must name tasks of the training stores: a misspelt key would silently do nothing.
    (Evaluation does not check: a checkpoint's settings may name tasks another database lacks.)"""
    known = {k for d in sampler.data for t in d.tasks for k in (t.name, f"{d.name}/{t.name}")}
    for setting in ("task_weights", "task_recent"):
        unknown = sorted(set(getattr(sconf, setting) or {}) - known)
        if unknown:
            sampler.close()
            raise ConfluenceError(f"training config [sampler] {setting}: unknown task(s) {unknown}; "
                                  f"known: {sorted(known)}")
