"""Batches of link tasks: each seed's context is built as for a derived task (the anchor row with its question
cell, "links to <target table>", and its observation-time cell), and the rows of the target table that the walk
reached are the candidates the link head scores; those in the seed's answer are the positives.

The context is the one every task gets (nothing after the observation time), so a candidate is a target row that
the anchor's visible history leads to: a repeat through its earlier links, a co-occurrence through other anchors'
rows, an attribute match through shared parents.

The catalogue side (`LinkConfig.catalogue`) reads a target row from its own context instead: the row as the anchor
of a short sequence at the seed's observation time (nothing later), with the task's question and observation-time
cells, so any row of the target table can be scored, reached by the anchor's context or not. Training batches then
hold seeds of one observation time, and their catalogue rows (`catalogue_sample`: some of each seed's answer, the
rest drawn uniformly) are read at that time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.sampler.builder import BatchBuilder, BuildResult
from confluence.sampler.data import TaskData, obs_time_cells, readonly
from confluence.sampler.sampler import Sampler
from confluence.sampler.splits import own_split, split_index, temporal_split
from confluence.stypes import D_TIME, US_PER_DAY, SemanticType

LINK_TASK_INDEX = 1 << 20  # link tasks' `TaskData.index` start here: their random streams never meet a cell task's
CATALOGUE_INDEX = 1 << 21  # and the target rows' own contexts here


def link_split_ids(store: Any, task: str, split: str) -> np.ndarray:
    """Seed indices of a link task's split, by its own observation-time cut-offs (RelBench's rule)."""
    cfg = own_split(store.link_task(task).split)
    ids = temporal_split(np.asarray(store.link_arrays(task).obs_time), int(cfg.t_val), int(cfg.t_test))
    return np.flatnonzero(ids == split_index(split)).astype(np.int64)


CALIBRATION_SHARE = 0.1  # the latest train seeds the link head never trains on: its ranker is calibrated on them
MAX_CALIBRATION = 1000


def train_and_calibration_ids(store: Any, task: str) -> tuple[np.ndarray, np.ndarray]:
    """A link task's train seeds split in two by observation time: those the link head trains on, and the latest
    (`CALIBRATION_SHARE` of them, at most `MAX_CALIBRATION`, whole observation times), on which the ranker learns
    how far to trust the model's probabilities against the fallback list: fitted on seeds the model was trained on,
    it would trust them too much."""
    ids = link_split_ids(store, task, "train")
    obs = np.asarray(store.link_arrays(task).obs_time)[ids]
    want = min(MAX_CALIBRATION, int(len(ids) * CALIBRATION_SHARE))
    if want == 0:
        return ids, ids[:0]
    cut = np.sort(obs)[len(ids) - want]
    calib = obs >= cut
    if calib.all():  # one observation time: no later part to hold out
        return ids, ids[:0]
    return ids[~calib], ids[calib]


def link_task_data(store: Any, name: str) -> TaskData:
    """A link task of `store` as the kernels read a task: a derived boolean question cell (its value is never
    shown: the cell is the target) and the observation-time cell; no excluded columns."""
    info, arr = store.link_task(name), store.link_arrays(name)
    n = int(np.asarray(arr.anchor_row).shape[0])
    index = LINK_TASK_INDEX + [t.name for t in store.link_tasks].index(name)
    return TaskData(
        name=name, index=index, target_stype=int(SemanticType.BOOLEAN), target_col=int(info.target_column_idx),
        is_derived=True, exclude_cols=readonly(np.zeros(0, np.int32), np.int32),
        cut_cols=readonly(np.array([info.target_column_idx], np.int32), np.int32), cat_block_start=0, cat_count=0,
        obs_col=int(info.obs_column_idx), anchor_row=readonly(arr.anchor_row, np.int64),
        obs_time=readonly(arr.obs_time, np.int64), tgt_f32=readonly(np.zeros(1), np.float32),
        tgt_ts=readonly(np.zeros((1, D_TIME)), np.float32), tgt_u32=readonly(np.zeros(1), np.uint32),
        tgt_bits=readonly(np.zeros((n + 7) // 8), np.uint8),
        tgt_valid=readonly(np.packbits(np.ones(n, bool), bitorder="little"), np.uint8),
        obs_ts=obs_time_cells(store, int(info.obs_column_idx), arr.obs_time))


def catalogue_time(times: np.ndarray) -> np.ndarray:
    """The time the catalogue is read at for questions at `times`: the start of their UTC day (never later than
    the question, so nothing after it; one pass over the target table serves every question of a day)."""
    t = np.asarray(times, dtype=np.int64)
    return t - np.mod(t, US_PER_DAY)


def item_task_data(store: Any, name: str, rows: np.ndarray, times: np.ndarray) -> TaskData:
    """Target rows `rows` (global) read from their own contexts at `times`: a task rooted at each row with the link
    task's question cell (never shown a value) and observation-time cell, and nothing after its time."""
    from confluence.sampler.sampler import anchor_seed_keys

    base = link_task_data(store, name)
    rows, times = np.asarray(rows, dtype=np.int64), np.asarray(times, dtype=np.int64)
    n = len(rows)
    none = replace(base, anchor_row=base.anchor_row[:0], obs_time=base.obs_time[:0])
    return replace(
        base, index=CATALOGUE_INDEX + base.index - LINK_TASK_INDEX, cut_cols=readonly(np.zeros(0, np.int32), np.int32),
        anchor_row=readonly(rows, np.int64), obs_time=readonly(times, np.int64),
        tgt_bits=readonly(np.zeros((n + 7) // 8), np.uint8), tgt_valid=readonly(np.zeros((n + 7) // 8), np.uint8),
        obs_ts=obs_time_cells(store, base.obs_col, times),
        seed_keys=anchor_seed_keys(none, rows, times))  # a row's draws keyed on (row, time), not its position


def anchor_link_data(store: Any, name: str, rows: np.ndarray, times: np.ndarray) -> TaskData:
    """A link task asked of any anchor rows `rows` (global) at observation times `times` (prediction): its contexts
    follow the task's rules, and an (anchor, time) that is a seed of the task draws that seed's context."""
    from confluence.sampler.sampler import anchor_seed_keys

    base = link_task_data(store, name)
    rows, times = np.asarray(rows, dtype=np.int64), np.asarray(times, dtype=np.int64)
    n = len(rows)
    return replace(base, anchor_row=readonly(rows, np.int64), obs_time=readonly(times, np.int64),
                   tgt_bits=readonly(np.zeros((n + 7) // 8), np.uint8),
                   tgt_valid=readonly(np.packbits(np.ones(n, bool), bitorder="little"), np.uint8),
                   obs_ts=obs_time_cells(store, base.obs_col, times), seed_keys=anchor_seed_keys(base, rows, times))


def catalogue_sample(seed_ids: np.ndarray, offsets: np.ndarray, targets: np.ndarray, catalog: tuple[int, int],
                     positives: int, negatives: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The catalogue rows of a training batch: up to `positives` rows of each seed's answer and `negatives` rows
    drawn uniformly from the target table, each once, ascending; and [len(seed_ids), M] whether each is in each
    seed's answer (a row drawn for one seed counts for every seed that links to it)."""
    picked = [rng.choice(targets[offsets[s]:offsets[s + 1]], size=min(positives, int(offsets[s + 1] - offsets[s])),
                         replace=False) for s in seed_ids]
    drawn = rng.integers(catalog[0], catalog[1], size=negatives)
    rows = np.unique(np.concatenate([*picked, drawn]).astype(np.int64))
    truth = np.stack([np.isin(rows, targets[offsets[s]:offsets[s + 1]]) for s in seed_ids])
    return rows, truth


@dataclass
class LinkBatch:
    """A built batch of a link task and, per sequence-local row (padded to the batch's R): whether it is a
    candidate (a real row of the target table other than the anchor) and whether it is in the seed's answer."""

    result: BuildResult
    candidates: np.ndarray  # bool [B, R]
    positives: np.ndarray  # bool [B, R]

    @property
    def rows(self) -> np.ndarray:
        """i64 [B, R]: the global row of each sequence-local row."""
        return self.result.rows[:, :self.candidates.shape[1]]


def build_link_batch(builder: BatchBuilder, task: TaskData, seed_ids: np.ndarray, catalog: tuple[int, int],
                     offsets: np.ndarray | None, targets: np.ndarray | None, epoch: int = 0, serial: bool = False
                     ) -> LinkBatch:
    """The batch of `seed_ids` (at most the batch size; filler sequences have no candidates) with its candidates and
    positives; `catalog`: the target table's global rows [first, end); `offsets` / `targets`: the answers of the
    task's seeds (None: anchors with no known answer, no positive)."""
    seed_ids = np.asarray(seed_ids, dtype=np.int64)
    res = builder.build(task, seed_ids, epoch, n_valid=len(seed_ids), serial=serial)
    b, r = res.batch.batch_size, res.batch.num_rows
    rows = res.rows[:, :r]
    real = (np.arange(r)[None, :] < res.nrows[:, None]) & (res.via[:, :r] != 0) & res.batch.seq_valid[:, None]
    cand = real & (rows >= catalog[0]) & (rows < catalog[1])
    pos = np.zeros((b, r), dtype=bool)
    for i, s in enumerate(seed_ids if offsets is not None and targets is not None else ()):
        pos[i] = cand[i] & np.isin(rows[i], targets[offsets[s]:offsets[s + 1]])
    return LinkBatch(res, cand, pos)


class LinkSource:
    """A link task of one store bound to a sampler: its batches for given seeds (`batch`), the target rows' own
    contexts (`item_batch`), and the per-epoch shuffled train seeds (`train_batches`)."""

    def __init__(self, store: Any, task: str, cfg: Any):
        self.store, self.task = store, task
        info = store.link_task(task)
        arr = store.link_arrays(task)
        self.offsets, self.targets = np.asarray(arr.offsets), np.asarray(arr.targets)
        self.obs_time = np.asarray(arr.obs_time)
        table = store.table(info.target_table)
        self.catalog = (table.row_offset, table.row_offset + table.num_rows)
        # contexts without labelled rows: a link task's labels are the answers themselves (not yet shown)
        plain = replace(cfg.sampler, labels=0, label_match=0, tasks=None, threads=1)
        self.sampler = Sampler([store], plain, seed=cfg.seed)
        self.data = link_task_data(store, task)
        self.batch_size = cfg.sampler.batch_size
        self.link = cfg.link
        self.item_batch_size = cfg.sampler.batch_size * cfg.link.positives + cfg.link.negatives
        cells = min(cfg.link.item_cells, cfg.sampler.seq_len)
        rows = min(cfg.sampler.max_rows, max(b for b in (*cfg.sampler.row_buckets, 16) if b <= max(cells // 2, 16)))
        # one row bucket: every catalogue batch has one shape, compiled once (not again mid-training)
        self.item_sampler = Sampler([store], replace(
            plain, batch_size=self.item_batch_size, seq_len=cells, max_rows=rows, row_buckets=(rows,)), seed=cfg.seed)

    def batch(self, seed_ids: np.ndarray, epoch: int = 0) -> LinkBatch:
        return build_link_batch(self.sampler.builders[0], self.data, seed_ids, self.catalog, self.offsets,
                                self.targets, epoch)

    def anchor_batch(self, rows: np.ndarray, times: np.ndarray) -> LinkBatch:
        """The contexts of any anchor rows (global, at most `batch_size`) at `times`, with their candidates."""
        data = anchor_link_data(self.store, self.task, rows, times)
        return build_link_batch(self.sampler.builders[0], data, np.arange(len(rows)), self.catalog, None, None)

    def item_batch(self, rows: np.ndarray, times: np.ndarray, epoch: int = 0) -> BuildResult:
        """The own contexts of target rows `rows` (global, at most `item_batch_size`) at `times`."""
        data = item_task_data(self.store, self.task, rows, times)
        return self.item_sampler.builders[0].build(data, np.arange(len(rows)), epoch, serial=True)

    def train_batches(self, seed: int) -> Iterator[tuple[int, np.ndarray]]:
        """Endless (epoch, seed ids) of the train seeds the head trains on (`train_and_calibration_ids`), each epoch
        in its own fixed order. With the catalogue side (`link.catalogue`) a batch holds seeds of one observation
        time (its catalogue rows are read at that time); the batches' order is shuffled."""
        ids, _ = train_and_calibration_ids(self.store, self.task)
        if len(ids) == 0:
            raise ConfluenceError(f"link task {self.task!r} has no train seeds")
        epoch = 0
        while True:
            rng = np.random.default_rng((seed, epoch))
            order = rng.permutation(ids)
            if self.link.catalogue:
                groups = [order[self.obs_time[order] == t] for t in np.unique(self.obs_time[ids])]
            else:
                groups = [order]
            batches = [np.sort(g[lo:lo + self.batch_size]) for g in groups
                       # whole batches; fewer seeds than a batch make one short batch (the builder pads it)
                       for lo in range(0, max(len(g) - self.batch_size, 0) + 1, self.batch_size)]
            for j in (rng.permutation(len(batches)) if self.link.catalogue else range(len(batches))):
                yield epoch, batches[j]
            epoch += 1

    def close(self) -> None:
        self.sampler.close()
        self.item_sampler.close()
