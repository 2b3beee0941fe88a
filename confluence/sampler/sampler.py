"""`Sampler`: one or several processed stores, the tasks served, their split seeds, and batches of given seeds.

The order in which batches are drawn (task choice, seed order, background building) is the batch stream's
(`confluence.sampler.stream.BatchStream`); the sampler builds what it is asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from confluence.batch import TrainingBatch
from confluence.errors import ConfluenceError
from confluence.sampler.builder import PHASES, BatchBuilder, BuildResult
from confluence.sampler.config import SamplerConfig, label_match_for, labels_for
from confluence.sampler.data import SamplerData, TaskData, obs_time_cells
from confluence.sampler.labels import (
    CONTEXT_SPLITS,
    TRAINING_CONTEXT,
    LabelIndex,
    build_label_index,
    label_times,
    match_columns,
    task_horizon,
    with_matches,
)
from confluence.sampler.rng import hash_unit, stream_key
from confluence.sampler.splits import split_index, split_seed_ids, task_split
from confluence.sampler.waits import has_waits, with_waits
from confluence.stypes import SemanticType
from confluence.targets import kind


@dataclass(frozen=True)
class TaskEntry:
    """One (database, task) the sampler serves; `key` ("db/task") names it in logs and stream positions."""

    db_idx: int
    db_name: str
    task: TaskData

    @property
    def key(self) -> str:
        return f"{self.db_name}/{self.task.name}"

    @property
    def target_stype(self) -> SemanticType:
        return SemanticType(int(self.task.target_stype))


class Sampler:
    """Seeds of the selected tasks of `stores` -> batches, deterministically for a given config and `seed`.

    `stores` are `confluence.store.Store` objects (or `SamplerData`). Each batch holds one task of one database.
    `rank` / `world_size` shard the seeds of every split round-robin over processes; `config.batch_size` is the
    batch of one process here (the batch stream divides a run's global batch size)."""

    def __init__(self, stores: Sequence[Any], config: SamplerConfig | None = None, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        self.config = config or SamplerConfig()
        if not stores:
            raise ConfluenceError("the sampler needs at least one store")
        if not 0 <= rank < world_size:
            raise ConfluenceError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.stores = list(stores)
        self.data = [s if isinstance(s, SamplerData) else SamplerData.from_store(s) for s in stores]
        self._pool = ThreadPoolExecutor(self.config.threads, "sampler") if self.config.threads > 1 else None
        self.builders = [BatchBuilder(d, self.config, i, self._pool, self.seed) for i, d in enumerate(self.data)]
        self._seed_cache: dict[tuple[int, str, str], np.ndarray] = {}
        self.entries = self._select_tasks()
        self._label_cache: dict[tuple[int, str, str], LabelIndex] = {}
        if self.config.labels > 0:  # every served task must say when its labels are known (a clear error now)
            for e in self.entries:
                if labels_for(self.config, e.db_name, e.task.name) > 0:
                    self.label_index(e.task.name, e.db_idx, "train")
        self.timings = dict.fromkeys(PHASES, 0.0)  # wall seconds per phase, over every build so far
        self.cpu_timings = dict.fromkeys(PHASES, 0.0)  # CPU seconds per phase (all worker threads)

    @property
    def pool(self) -> ThreadPoolExecutor | None:
        """The worker threads (None with `threads` = 1, or once closed)."""
        return self._pool

    def _select_tasks(self) -> list[TaskEntry]:
        all_entries = [TaskEntry(i, d.name, self._with_waits(i, t)) for i, d in enumerate(self.data) for t in d.tasks]
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

    def _with_waits(self, db_idx: int, task: TaskData) -> TaskData:
        """`task` with its waits from its whole train split (every rank's seeds: all ranks answer alike)."""
        if not has_waits(task):
            return task
        cfg = task_split(self.stores[db_idx], task.name, self.config.split)
        train = split_seed_ids(task.name, task.anchor_row, task.obs_time, cfg, "train")
        if self.world_size == 1:  # this rank's train seeds too: `seed_ids` need not draw the split again
            self._seed_cache[(db_idx, task.name, "train")] = train
        return with_waits(task, train)

    def entry(self, task: str, db: int | str = 0) -> TaskEntry:
        """The entry of `task` (a name or "db/task") in database `db` (index or name)."""
        for e in self.entries:
            if task == e.key or (task == e.task.name and db in (e.db_idx, e.db_name)):
                return e
        raise ConfluenceError(f"task {task!r} of database {db!r} is not served (served: {[e.key for e in self.entries]})")

    def seed_ids(self, split: str, task: str, db: int | str = 0) -> np.ndarray:
        """Seed indices of `task` in `split` for this rank (ascending). A task that records its own split (RelBench's
        cut-offs, `confluence.sampler.splits.task_split`) uses it whatever `config.split` says."""
        e = self.entry(task, db)
        split_index(split)
        k = (e.db_idx, e.task.name, split)
        if k not in self._seed_cache:
            cfg = task_split(self.stores[e.db_idx], e.task.name, self.config.split)  # a RelBench task's own
            self._seed_cache[k] = split_seed_ids(
                e.task.name, e.task.anchor_row, e.task.obs_time, cfg, split, self.rank, self.world_size)
        return self._seed_cache[k]

    def label_index(self, task: str, db: int | str = 0, context: str = "train") -> LabelIndex | None:
        """The labels contexts of phase `context` may show for `task` (None with `sampler.labels` = 0): the seeds
        of the splits `CONTEXT_SPLITS[context]` of the whole task (all ranks), indexed once and cached."""
        if self.config.labels == 0:
            return None
        if context not in CONTEXT_SPLITS:
            raise ConfluenceError(f"unknown label context {context!r} (expected one of: {', '.join(CONTEXT_SPLITS)})")
        e = self.entry(task, db)
        if labels_for(self.config, e.db_name, e.task.name) == 0:
            return None
        key = (e.db_idx, e.task.name, CONTEXT_SPLITS[context])  # contexts of the same splits share one index
        if key not in self._label_cache:
            store = self.stores[e.db_idx]
            cfg = task_split(store, e.task.name, self.config.split)
            pool = np.concatenate([split_seed_ids(e.task.name, e.task.anchor_row, e.task.obs_time, cfg, sp)
                                   for sp in CONTEXT_SPLITS[context]])
            times = label_times(e.task.obs_time, bool(e.task.is_derived), task_horizon(store, e.task.name),
                                f"{e.db_name}/{e.task.name}")
            d = self.data[e.db_idx]
            index = build_label_index(e.task, np.sort(pool), times, d.tab_row_off)
            if label_match_for(self.config, e.db_name, e.task.name) > 0:  # matches: the anchor table's values
                table = int(np.searchsorted(d.tab_row_off, index.a_lo, side="right") - 1)
                index = with_matches(index, match_columns(d, e.task, table))
            self._label_cache[key] = index
        return self._label_cache[key]

    def build(self, task: str | TaskData, seed_ids: np.ndarray, db: int | str = 0, epoch: int = 0,
              serial: bool = False, context: str = TRAINING_CONTEXT) -> BuildResult:
        """A batch for these seed indices (at most `batch_size`, in order; a short list is padded with filler whose
        `seq_valid` is False) plus walk details and phase timings. `task` is a served task's name or a `TaskData`
        of database `db` (e.g. from `anchor_task`). `serial` builds in the calling thread only. `context`: the
        phase whose labels the contexts may show (`CONTEXT_SPLITS`; with `sampler.labels` > 0); the default is a
        training context, the only one that `labels_off` and `relabel` change."""
        if isinstance(task, TaskData):
            data, db_idx = task, int(db)
        else:
            e = self.entry(task, db)
            data, db_idx = e.task, e.db_idx
        res = self.builders[db_idx].build(data, np.asarray(seed_ids, dtype=np.int64), epoch, serial=serial,
                                          **self.label_args(data, db_idx, context))
        self.account(res)
        return res

    def label_args(self, data: TaskData, db_idx: int, context: str) -> dict[str, Any]:
        """The builder's `labels` / `own_seeds` for a batch of `data` (a served task's, or an ad-hoc anchor task
        built from one by `anchor_task`, whose seeds are not the task's), and in training contexts the shares of
        `labels_off` and `relabel`."""
        out: dict[str, Any] = {}
        # the training stream's contexts only (not an evaluation of the train split), like labels_off
        if context == TRAINING_CONTEXT and self.config.relabel > 0:
            out["relabel_share"] = float(self.config.relabel)
        if labels_for(self.config, self.data[db_idx].name, data.name) == 0:
            return out
        base = next(e.task for e in self.entries if e.db_idx == db_idx and e.task.name == data.name)
        out.update(labels=self.label_index(data.name, db_idx, context), own_seeds=data is base)
        if context == TRAINING_CONTEXT and self.config.labels_off > 0:  # training only; evaluation shows them all
            out["labels_off"] = float(self.config.labels_off)
        return out

    def account(self, res: BuildResult) -> None:
        """Add a build's phase timings to the totals (`timings`, `cpu_timings`)."""
        for k, v in res.timings.items():
            self.timings[k] += v
            self.cpu_timings[k] += res.cpu[k]

    def batch_for_seeds(self, task: str | TaskData, seed_ids: np.ndarray, db: int | str = 0,
                        epoch: int = 0) -> TrainingBatch:
        """The batch for exactly these seeds (in order); a short list is padded with `seq_valid` False filler."""
        return self.build(task, seed_ids, db, epoch).batch

    def anchor_task(self, task: str, anchor_rows: np.ndarray, obs_times: np.ndarray, db: int | str = 0) -> TaskData:
        """`task` re-rooted at arbitrary anchor rows (global row indices) and observation times, with unknown (NULL)
        targets: seed `i` of the result is (anchor_rows[i], obs_times[i]). The context follows the task's rules
        (excluded columns, the observation-time cell, no row after the observation time). An anchor that is a seed of
        the task (the same row and observation time) draws its contexts with that seed's random numbers, so with the
        same labels readable it gets exactly the contexts an evaluation of that seed gets (`seed_keys`); any other
        anchor's are keyed on its row and time, whatever its position in the request."""
        base = self.entry(task, db).task
        rows = np.asarray(anchor_rows, dtype=np.int64)
        obs = np.asarray(obs_times, dtype=np.int64)
        if rows.shape != obs.shape or rows.ndim != 1:
            raise ConfluenceError(f"task {task!r}: anchor rows {rows.shape} and observation times {obs.shape} differ")
        n = rows.shape[0]
        tgt = kind(base.target_stype).unknown_targets(n, int(base.cat_block_start))
        store = self.stores[self.entry(task, db).db_idx]
        return dataclasses.replace(
            base, anchor_row=rows, obs_time=obs,
            tgt_f32=tgt["f32"], tgt_ts=tgt["ts"], tgt_u32=tgt["u32"], tgt_bits=tgt["bits"],
            tgt_valid=np.zeros((n + 7) // 8, np.uint8),
            obs_ts=obs_time_cells(store, base.obs_col, obs),
            seed_keys=anchor_seed_keys(base, rows, obs),
        )

    def render(self, task: str, seed_id: int, db: int | str = 0, epoch: int = 0, max_cells: int | None = None) -> str:
        """Plain-text view of the sequence of one seed: rows, cells, the three masks (see `render_sequence`)."""
        from confluence.sampler.show import render_sequence

        e = self.entry(task, db)
        res = self.build(task, np.array([seed_id]), db, epoch)
        return render_sequence(res, self.data[e.db_idx], 0, task_name=e.task.name, max_cells=max_cells)

    def close(self) -> None:
        """Shut the worker pool down: builds not yet started are cancelled, running ones finish."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            for b in self.builders:
                b._pool = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def anchor_seed_keys(base: TaskData, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """The random-number key of each (anchor row, observation time): the index of the task's seed with that row and
    time when there is one (the first in the task's order), else a 52-bit hash of the pair plus 2**62 (never a seed
    index)."""
    pair = np.dtype([("row", "<i8"), ("obs", "<i8")])
    seeds = np.empty(base.anchor_row.shape[0], pair)
    seeds["row"], seeds["obs"] = base.anchor_row, base.obs_time
    asked = np.empty(rows.shape[0], pair)
    asked["row"], asked["obs"] = rows, obs
    order = np.argsort(seeds, kind="stable")
    at = np.minimum(np.searchsorted(seeds[order], asked), max(len(order) - 1, 0))
    found = (seeds[order][at] == asked) if len(order) else np.zeros(len(asked), bool)
    with np.errstate(over="ignore"):
        mixed = (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ obs.astype(np.uint64)
    hashed = (hash_unit(stream_key("anchor"), mixed.view(np.int64)) * float(1 << 52)).astype(np.int64) + (1 << 62)
    return np.where(found, order[at] if len(order) else 0, hashed).astype(np.int64)
