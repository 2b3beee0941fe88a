"""`Sampler`: the Python API over one or several processed stores (seeds -> `TrainingBatch`es)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.batch import TrainingBatch
from confluence.sampler.builder import PHASES, BatchBuilder, BuildResult
from confluence.sampler.config import SamplerConfig
from confluence.sampler.data import SamplerData, TaskData
from confluence.sampler.prefetch import Prefetcher
from confluence.sampler.rng import stream_key
from confluence.sampler.splits import split_index, split_seed_ids


@dataclass(frozen=True)
class TaskEntry:
    """One (database, task) the sampler serves."""

    db_idx: int
    db_name: str
    task: TaskData

    @property
    def key(self) -> str:
        return f"{self.db_name}/{self.task.name}"


class Sampler:
    """Seeds of the selected tasks of `stores` -> batches, deterministically for a given config.

    `stores` are `confluence.store.Store` objects (or `SamplerData`). Each batch holds one task of one database.
    """

    def __init__(self, stores: Sequence[Any], config: SamplerConfig | None = None):
        self.config = config or SamplerConfig()
        self.config.check()
        if not stores:
            raise ConfluenceError("the sampler needs at least one store")
        self.data = [s if isinstance(s, SamplerData) else SamplerData.from_store(s) for s in stores]
        self._pool = ThreadPoolExecutor(self.config.threads, "sampler") if self.config.threads > 1 else None
        self.builders = [BatchBuilder(d, self.config, i, self._pool) for i, d in enumerate(self.data)]
        self.entries = self._select_tasks()
        self._seed_cache: dict[tuple[int, str, str], np.ndarray] = {}
        self.timings = dict.fromkeys(PHASES, 0.0)  # wall seconds per phase, over every build so far
        self.cpu_timings = dict.fromkeys(PHASES, 0.0)  # CPU seconds per phase (all worker threads)

    def _select_tasks(self) -> list[TaskEntry]:
        all_entries = [TaskEntry(i, d.name, t) for i, d in enumerate(self.data) for t in d.tasks]
        if self.config.tasks is None:
            return all_entries
        picked: list[TaskEntry] = []
        for name in self.config.tasks:
            hits = [e for e in all_entries if name in (e.task.name, e.key)]
            if not hits:
                known = ", ".join(e.key for e in all_entries) or "none"
                raise ConfluenceError(f"task {name!r} not found (known tasks: {known})")
            picked += [h for h in hits if h not in picked]
        return picked

    def entry(self, task: str, db: int | str = 0) -> TaskEntry:
        """The entry of `task` (a name or "db/task") in database `db` (index or name)."""
        for e in self.entries:
            if task == e.key or (task == e.task.name and db in (e.db_idx, e.db_name)):
                return e
        raise ConfluenceError(f"task {task!r} of database {db!r} is not served (served: {[e.key for e in self.entries]})")

    def seed_ids(self, split: str, task: str, db: int | str = 0) -> np.ndarray:
        """Seed indices of `task` in `split` for this rank (ascending)."""
        e = self.entry(task, db)
        split_index(split)
        k = (e.db_idx, e.task.name, split)
        if k not in self._seed_cache:
            self._seed_cache[k] = split_seed_ids(
                e.task.name, e.task.anchor_row, e.task.obs_time, self.config.split, split, self.config.rank,
                self.config.world_size,
            )
        return self._seed_cache[k]

    def build(self, task: str, seed_ids: np.ndarray, db: int | str = 0, epoch: int = 0) -> BuildResult:
        """A batch for these seed indices plus walk details and phase timings (at most batch_size seeds)."""
        e = self.entry(task, db)
        res = self.builders[e.db_idx].build(e.task, np.asarray(seed_ids, dtype=np.int64), epoch)
        self._account(res)
        return res

    def _account(self, res: BuildResult) -> None:
        for k, v in res.timings.items():
            self.timings[k] += v
            self.cpu_timings[k] += res.cpu[k]

    def batch_for_seeds(self, task: str, seed_ids: np.ndarray, db: int | str = 0, epoch: int = 0) -> TrainingBatch:
        """The batch for exactly these seeds (in order); a short list is padded with `seq_valid` False filler."""
        return self.build(task, seed_ids, db, epoch).batch

    def render(self, task: str, seed_id: int, db: int | str = 0, epoch: int = 0, max_cells: int | None = None) -> str:
        """Plain-text view of the sequence of one seed: rows, cells, the three masks (see `render_sequence`)."""
        from confluence.sampler.show import render_sequence

        e = self.entry(task, db)
        res = self.build(task, np.array([seed_id]), db, epoch)
        return render_sequence(res, self.data[e.db_idx], 0, task_name=e.task.name, max_cells=max_cells)

    def batches(self, split: str = "train", epoch: int = 0) -> Iterator[TrainingBatch]:
        """Train: `batches_per_epoch` batches, a (database, task) drawn per batch by weight, seeds shuffled per
        epoch. Val / test: every seed of every task once, in order, the last batch of a task padded.

        With `threads` > 1 whole batches are built concurrently, each serially inside one pool worker, about
        2 x threads ahead of the consumer, and yielded in order: the stream is the same for any thread count."""
        specs = self._specs(split, epoch)
        if self._pool is None:
            for e, ids in specs:
                yield self.build(e.task.name, ids, e.db_idx, epoch).batch
            return
        yield from self._concurrent(specs, epoch)

    def _specs(self, split: str, epoch: int) -> Iterator[tuple[TaskEntry, np.ndarray]]:
        """The (entry, seed ids) of each batch of `batches(split, epoch)`, in order (computed by the consumer)."""
        if split_index(split) == 0:
            yield from self._train_specs(epoch)
            return
        bsz = self.config.batch_size
        for e in self.entries:
            ids = self.seed_ids(split, e.task.name, e.db_idx)
            for lo in range(0, ids.shape[0], bsz):
                yield e, ids[lo : lo + bsz]

    def _submit(self, e: TaskEntry, ids: np.ndarray, epoch: int) -> Future[BuildResult] | None:
        pool = self._pool
        if pool is None:
            return None
        try:
            return pool.submit(self.builders[e.db_idx].build, e.task, ids, epoch, serial=True)
        except RuntimeError:  # the pool was shut down (sampler closed): the consumer builds it itself
            return None

    def _concurrent(self, specs: Iterator[tuple[TaskEntry, np.ndarray]], epoch: int) -> Iterator[TrainingBatch]:
        """Whole batches built in the pool (`serial` builds: no nested use of the pool), bounded lookahead,
        results yielded in submission order. Timings are added here, in the consumer, when a batch is yielded.
        Leaving early (close, error, abandoned generator) cancels the builds not yet started; a build whose
        future was cancelled by `close()` is rebuilt in the consumer, so the stream stays complete."""
        lookahead = 2 * self.config.threads
        pending: deque[tuple[TaskEntry, np.ndarray, Future[BuildResult] | None]] = deque()
        spec_error: BaseException | None = None
        more = True
        try:
            while True:
                while more and len(pending) < lookahead:
                    try:
                        e, ids = next(specs)
                    except StopIteration:
                        more = False
                        break
                    except Exception as exc:  # noqa: BLE001 - raised in order, after the batches before it
                        spec_error, more = exc, False
                        break
                    ids = np.asarray(ids, dtype=np.int64)
                    pending.append((e, ids, self._submit(e, ids, epoch)))
                if not pending:
                    if spec_error is not None:
                        raise spec_error
                    return
                e, ids, fut = pending.popleft()
                res = None
                if fut is not None:
                    try:
                        res = fut.result()
                    except CancelledError:
                        res = None
                if res is None:
                    res = self.builders[e.db_idx].build(e.task, ids, epoch, serial=True)
                self._account(res)
                yield res.batch
        finally:
            for _e, _ids, f in pending:
                if f is not None:
                    f.cancel()
            specs.close()

    def num_train_batches(self) -> int:
        if self.config.batches_per_epoch is not None:
            return self.config.batches_per_epoch
        total = sum(self.seed_ids("train", e.task.name, e.db_idx).shape[0] for e in self.entries)
        return max(total // self.config.batch_size, 1 if total else 0)

    def _weights(self, live: list[TaskEntry]) -> np.ndarray:
        given = self.config.task_weights or {}
        w = []
        for e in live:
            n = self.seed_ids("train", e.task.name, e.db_idx).shape[0]
            w.append(float(given.get(e.key, given.get(e.task.name, n))))
        arr = np.asarray(w, dtype=np.float64)
        if np.any(arr < 0) or arr.sum() <= 0:
            raise ConfluenceError(f"task weights must be non-negative with a positive sum, got {dict(zip([e.key for e in live], w, strict=True))}")
        return arr / arr.sum()

    def _train_specs(self, epoch: int) -> Iterator[tuple[TaskEntry, np.ndarray]]:
        cfg = self.config
        live = [e for e in self.entries if self.seed_ids("train", e.task.name, e.db_idx).shape[0] > 0]
        if not live:
            raise ConfluenceError("no training seeds: every selected task has an empty train split for this rank")
        probs = self._weights(live)
        rng = np.random.Generator(np.random.PCG64(int(stream_key("tasks", cfg.seed, epoch))))
        cursors = [0] * len(live)
        cycles = [0] * len(live)
        orders: list[np.ndarray] = [np.empty(0, np.int64)] * len(live)
        for _ in range(self.num_train_batches()):
            k = int(rng.choice(len(live), p=probs))
            e = live[k]
            ids = self.seed_ids("train", e.task.name, e.db_idx)
            picked = []
            while len(picked) < cfg.batch_size:
                if cursors[k] >= orders[k].shape[0]:
                    g = np.random.Generator(np.random.PCG64(int(stream_key("shuffle", cfg.seed, epoch, e.key, cycles[k]))))
                    orders[k] = ids[g.permutation(ids.shape[0])]
                    cursors[k] = 0
                    cycles[k] += 1
                take = min(cfg.batch_size - len(picked), orders[k].shape[0] - cursors[k])
                picked.extend(orders[k][cursors[k] : cursors[k] + take].tolist())
                cursors[k] += take
            yield e, np.asarray(picked, np.int64)

    def prefetch(self, split: str = "train", epoch: int = 0, capacity: int = 3) -> Prefetcher[TrainingBatch]:
        """`batches(split, epoch)` produced in a background thread, `capacity` batches ahead."""
        return Prefetcher(lambda: self.batches(split, epoch), capacity=capacity, name=f"sampler-{split}")

    def close(self) -> None:
        """Shut the worker pool down: builds not yet started are cancelled (an open stream then builds the rest
        in its consumer thread), running ones finish."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            for b in self.builders:
                b._pool = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
