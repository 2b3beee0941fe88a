"""`BatchStream`: the one way batches leave the sampler, for training, validation, evaluation, prediction and the
sampler benchmark.

Training (`next_train`): each batch draws a task (`SamplerConfig.task_choice`, `task_weights`) from a seeded
generator, then takes the next `batch_size` seeds of that task's per-epoch shuffle (a new shuffle when the epoch's
seeds are used up). The stream's position (the generator state, and per task its epoch and batch) is what a
checkpoint saves: `restore(position)` continues the exact same sequence.

Ordered passes (`ordered`): given seeds of a task, in order, in batches of at most `batch_size` (the last one padded
with `seq_valid` False filler): validation, evaluation and prediction.

Both build ahead of the consumer: with `threads` > 1 whole batches are built concurrently in the sampler's worker
threads (a bounded lookahead, yielded in order), and with `prefetch` > 0 in a background thread holding at most
that many finished batches. Neither changes the batches or their order.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from confluence.batch import TrainingBatch
from confluence.errors import ConfigError, ConfluenceError
from confluence.sampler.builder import BuildResult
from confluence.sampler.config import PER_TASK_SETTINGS, SamplerConfig
from confluence.sampler.data import TaskData
from confluence.sampler.labels import TRAINING_CONTEXT
from confluence.sampler.sampler import Sampler, TaskEntry
from confluence.sampler.splits import subsample
from confluence.toolkit.prefetch import Prefetcher


@dataclass(frozen=True)
class _Spec:
    """One batch to build: its task (an entry or ad-hoc task data), seeds, database, epoch; and for a training
    batch, what it moves in the stream's position: the task generator's state and the task's (epoch, batch)."""

    task: TaskEntry | TaskData
    seed_ids: np.ndarray
    db_idx: int
    epoch: int
    moves: tuple[dict[str, Any], str, int, int] | None = None
    # whose labels the contexts may show (`confluence.sampler.labels.CONTEXT_SPLITS`); the training stream's own
    # context by default, the only one that `labels_off` and `relabel` change
    context: str = TRAINING_CONTEXT


class BatchStream:
    """Batches of a `Sampler`'s tasks: the training stream and ordered passes over given seeds (module doc)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.config: SamplerConfig = sampler.config
        self.tasks: list[TaskEntry] = list(sampler.entries)
        self._position = {"tasks": np.random.default_rng(sampler.seed).bit_generator.state,
                          "streams": {e.key: {"epoch": 0, "batch": 0} for e in self.tasks}}
        self._train: Iterator[tuple[TrainingBatch, _Spec]] | None = None

    # ---- opening
    @classmethod
    def open(cls, stores: Sequence[Any], config: SamplerConfig, *, seed: int = 0, rank: int = 0,
             world_size: int = 1) -> BatchStream:
        """A stream over `stores` (Store objects, SamplerData or store paths). `config.batch_size` is the batch
        over all `world_size` processes; this process builds its `rank`-th share of every split."""
        from confluence.store import Store

        if config.batch_size % world_size:
            raise ConfigError("sampler.batch_size", f"{config.batch_size} is not divisible by the {world_size} "
                                                    "processes of the run")
        opened = [Store.open(s) if isinstance(s, str | Path) else s for s in stores]
        local = replace(config, batch_size=config.batch_size // world_size)
        return cls(Sampler(opened, local, seed=seed, rank=rank, world_size=world_size))

    @property
    def stores(self) -> list[Any]:
        return self.sampler.stores

    def check_task_keys(self) -> None:
        """Per-task settings (`PER_TASK_SETTINGS`) must name tasks of the stores: a misspelt key would
        silently do nothing. (Training checks; evaluation does not, since a checkpoint's settings may name tasks
        another database lacks.)"""
        known = {k for d in self.sampler.data for t in d.tasks for k in (t.name, f"{d.name}/{t.name}")}
        for setting in PER_TASK_SETTINGS:
            unknown = sorted(set(getattr(self.config, setting) or {}) - known)
            if unknown:
                raise ConfigError(f"sampler.{setting}", f"unknown task(s) {unknown}; known: {sorted(known)}")

    # ---- training
    def train_seed_ids(self, entry: TaskEntry) -> np.ndarray:
        return self.sampler.seed_ids("train", entry.task.name, entry.db_idx)

    def task_probabilities(self) -> dict[str, float]:
        """The share of training batches each task gets under `task_choice` and `task_weights` (key -> share)."""
        _, probs, dbs = self._choice_table()
        if dbs is None:
            return {e.key: float(p) for e, p in zip(self.tasks, probs, strict=True)}
        out = {}
        for members, p in dbs.values():
            for k, pk in zip(members, p, strict=True):
                out[self.tasks[k].key] = float(pk) / len(dbs)
        return out

    def _weight(self, e: TaskEntry) -> float:
        given = self.config.task_weights or {}
        return float(given.get(e.key, given.get(e.task.name, 1.0)))

    def _choice_table(self):
        """(uniform?, per-task probabilities or None, per-database (members, probabilities) or None)."""
        cfg = self.config
        w = np.array([self._weight(e) for e in self.tasks], dtype=np.float64)
        n_seeds = np.array([self.train_seed_ids(e).shape[0] for e in self.tasks], dtype=np.float64)
        empty = [e.key for e, wk, n in zip(self.tasks, w, n_seeds, strict=True) if wk > 0 and n == 0]
        if empty:
            raise ConfluenceError(f"task(s) {empty} have no training seeds in this shard; exclude them (sampler.tasks), "
                                  "give them the weight 0 (sampler.task_weights) or re-split")
        if cfg.task_choice == "seeds":
            w = w * n_seeds
        if not w.sum() > 0:
            raise ConfigError("sampler.task_weights", "every task has weight 0: nothing to train on")
        plain = cfg.task_choice != "seeds" and not cfg.task_weights
        if cfg.task_choice != "database_first":
            return plain, w / w.sum(), None
        dbs: dict[int, tuple[list[int], np.ndarray]] = {}
        for db in sorted({e.db_idx for e in self.tasks}):
            members = [k for k, e in enumerate(self.tasks) if e.db_idx == db]
            if w[members].sum() > 0:
                dbs[db] = (members, w[members] / w[members].sum())
        return plain, w / w.sum(), dbs

    def _train_specs(self, position: dict[str, Any]) -> Iterator[_Spec]:
        """The training batches from `position` on, each with what it moves in the position (runs in the
        producer, ahead of the consumer)."""
        plain, probs, dbs = self._choice_table()
        rng = np.random.default_rng()
        rng.bit_generator.state = copy.deepcopy(position["tasks"])
        pos = {k: [int(v["epoch"]), int(v["batch"])] for k, v in position["streams"].items()}
        orders: dict[str, tuple[int, np.ndarray]] = {}
        bsz, seed = self.config.batch_size, self.sampler.seed
        n = len(self.tasks)
        while True:
            if dbs is None:
                k = int(rng.integers(n)) if plain else int(rng.choice(n, p=probs))
            else:
                db_list = list(dbs)
                members, p = dbs[db_list[int(rng.integers(len(db_list)))]]
                k = members[int(rng.integers(len(members)))] if plain else members[int(rng.choice(len(members), p=p))]
            e = self.tasks[k]
            epoch, idx = pos[e.key]
            ids = self.train_seed_ids(e)
            if orders.get(e.key, (None,))[0] != epoch:  # this epoch's shuffle, seeded by (seed, epoch, task key)
                g = np.random.default_rng([seed, epoch, *e.key.encode()])
                orders[e.key] = (epoch, ids[g.permutation(ids.shape[0])])
            order = orders[e.key][1]
            seeds = np.resize(order, max(bsz, ids.shape[0]))[idx * bsz: (idx + 1) * bsz]
            per_epoch = max(ids.shape[0] // bsz, 1)
            pos[e.key] = [epoch + (idx + 1) // per_epoch, (idx + 1) % per_epoch]
            # the generator's state is a fresh dict on every read: the spec owns it
            yield _Spec(e, seeds, e.db_idx, epoch, (rng.bit_generator.state, e.key, *pos[e.key]))

    def next_train(self) -> TrainingBatch:
        """The next training batch (the stream's position moves past it)."""
        if self._train is None:
            self._train = self._run(self._train_specs(copy.deepcopy(self._position)))
        batch, spec = next(self._train)
        rng_state, key, epoch, idx = spec.moves
        self._position["tasks"] = rng_state
        self._position["streams"][key] = {"epoch": epoch, "batch": idx}
        return batch

    def position(self) -> dict[str, Any]:
        """JSON-able position after the last training batch handed out: enough to continue the same sequence."""
        return copy.deepcopy(self._position)

    @staticmethod
    def drawn_tasks(position: dict[str, Any]) -> frozenset[str]:
        """The "database/task" keys of a `position()` that training batches were drawn from (a run's trained tasks)."""
        streams = (position or {}).get("streams") or {}
        return frozenset(k for k, v in streams.items() if int(v.get("epoch", 0)) or int(v.get("batch", 0)))

    def restore(self, position: dict[str, Any]) -> None:
        """Continue the training stream from `position` (from `position()`, e.g. of a checkpoint)."""
        missing = sorted(set(self._position["streams"]) - set(position.get("streams", {})))
        if missing or "tasks" not in position:
            raise ConfluenceError(f"the saved stream position lacks stream(s) {missing or ['the task generator']}: "
                                  "was it saved with other databases or tasks?")
        self._stop_train()
        self._position = {"tasks": copy.deepcopy(position["tasks"]),
                          "streams": {k: dict(position["streams"][k]) for k in self._position["streams"]}}

    # ---- ordered passes
    def ordered(self, task: str | TaskData, seed_ids: np.ndarray, db: int | str = 0,
                epoch: int = 0, context: str = "train") -> Iterator[TrainingBatch]:
        """Batches of exactly these seeds, in order, at most `batch_size` each (the last one padded with filler whose
        `seq_valid` is False). `task` is a served task or ad-hoc `TaskData` of database `db` (`Sampler.anchor_task`).
        `context`: with labelled context, the phase whose labels the contexts may show ("train": train labels only,
        the safe default; "test": train and validation labels; "all": every label, for new anchors)."""
        if isinstance(task, TaskData):
            target, db_idx = task, int(db)
        else:
            target = self.sampler.entry(task, db)
            db_idx = target.db_idx
        ids = np.asarray(seed_ids, dtype=np.int64)
        bsz = self.config.batch_size
        specs = (_Spec(target, ids[lo: lo + bsz], db_idx, epoch, context=context)
                 for lo in range(0, ids.shape[0], bsz))
        run = self._run(specs)
        try:
            for batch, _ in run:
                yield batch
        finally:  # an abandoned pass stops its producer
            close = getattr(run, "close", None)
            if close is not None:
                close()

    def split(self, split: str, task: str, db: int | str = 0, max_batches: int | None = None) -> Iterator[TrainingBatch]:
        """`ordered` over this rank's seeds of `split` (with `max_batches`, that many batches' worth drawn across the
        split: `splits.subsample`), with the labels a context of that split may show."""
        ids = self.sampler.seed_ids(split, task, db)
        if max_batches is not None:
            ids = subsample(ids, max_batches * self.config.batch_size)
        return self.ordered(task, ids, db, context=split)

    # ---- building ahead
    def _build(self, spec: _Spec, serial: bool) -> BuildResult:
        task = spec.task.task if isinstance(spec.task, TaskEntry) else spec.task
        return self.sampler.builders[spec.db_idx].build(task, spec.seed_ids, spec.epoch, serial=serial,
                                                        **self.sampler.label_args(task, spec.db_idx, spec.context))

    def _built(self, specs: Iterator[_Spec]) -> Iterator[tuple[TrainingBatch, _Spec]]:
        """The batches of `specs` in order: built here, or (threads > 1) whole batches in the worker pool with a
        lookahead of 2 x threads. Leaving early cancels the builds not started; a build cancelled by `close()` is
        rebuilt here, so the stream stays complete; a failing build raises at its turn."""
        pool = self.sampler.pool
        if pool is None:
            for spec in specs:
                res = self._build(spec, serial=False)
                self.sampler.account(res)
                yield res.batch, spec
            return
        lookahead = 2 * self.config.threads
        pending: deque[tuple[_Spec, Future[BuildResult] | None]] = deque()
        spec_error: BaseException | None = None
        more = True
        try:
            while True:
                while more and len(pending) < lookahead:
                    try:
                        spec = next(specs)
                    except StopIteration:
                        more = False
                        break
                    except Exception as exc:  # noqa: BLE001 - raised in order, after the batches before it
                        spec_error, more = exc, False
                        break
                    pending.append((spec, self._submit(spec)))
                if not pending:
                    if spec_error is not None:
                        raise spec_error
                    return
                spec, fut = pending.popleft()
                res = None
                if fut is not None:
                    try:
                        res = fut.result()
                    except CancelledError:
                        res = None
                if res is None:
                    res = self._build(spec, serial=True)
                self.sampler.account(res)
                yield res.batch, spec
        finally:
            for _spec, f in pending:
                if f is not None:
                    f.cancel()
            specs.close()

    def _submit(self, spec: _Spec) -> Future[BuildResult] | None:
        pool = self.sampler.pool
        if pool is None:
            return None
        try:
            return pool.submit(self._build, spec, True)
        except RuntimeError:  # the pool was shut down (stream closed): the consumer builds it itself
            return None

    def _run(self, specs: Iterator[_Spec]) -> Iterator[tuple[TrainingBatch, _Spec]]:
        """`_built(specs)`, in a background thread `prefetch` batches ahead when `prefetch` > 0."""
        if self.config.prefetch == 0:
            return self._built(specs)
        return Prefetcher(lambda: self._built(specs), capacity=self.config.prefetch, name="batch-stream")

    def _stop_train(self) -> None:
        if self._train is not None:
            close = getattr(self._train, "close", None)
            if close is not None:
                close()
            self._train = None

    def close(self) -> None:
        """Stop the training stream's producer and shut the sampler's worker pool down."""
        self._stop_train()
        self.sampler.close()

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
