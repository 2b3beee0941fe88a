"""`predict` and `serve` on a link task: for each anchor (a row of the anchor table at an observation time), the k
rows of the target table it will likeliest link to within the task's horizon, named by primary key, each with its
calibrated chance (`inference.links.LinkRanker`, calibrated once per task). Any anchor row is answered, one with
no link history too (its lists fall back to the most linked rows).

The table `predict --task LINKTASK` writes: one row per (anchor, rank), anchors in the order asked, ranks 1, 2, ...
Columns: the anchor table's primary key (named as there), `observation_time`, `rank`, the target table's primary
key (named as there, `target_<name>` when an anchor column has that name) and `score`: the calibrated probability
that the anchor links to that row within the horizon, non-increasing with rank. A target table of fewer than k rows
gives fewer ranks. The service answers the same rows grouped per anchor (`link_json_rows`): the anchor's key,
`observation_time`, and the list of target keys with the list of their scores.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from confluence.errors import ConfluenceError
from confluence.store import Store

log = logging.getLogger("confluence.serving")

LINK_METADATA_KEY = b"confluence.link"  # schema metadata of a link task's prediction table: task, k, anchors, JSON
CELL_ONLY = ("blend", "explain", "certify", "context_labels")  # `predict` options a link task refuses
CHUNK_BATCHES = 8  # anchors ranked per progress step, in the ranker's batches


def is_link_task(store: Any, task: str) -> bool:
    """Whether `task` is one of the store's link tasks."""
    return any(t.name == task for t in getattr(store, "link_tasks", ()))


def anchor_table_of(store: Any, task: str) -> str:
    """The anchor table of a cell or link task (the store's error naming its tasks for neither)."""
    return store.link_task(task).anchor_table if is_link_task(store, task) else store.task(task).anchor_table


def served_link_tasks(loaded: Any, store: Store) -> list[str]:
    """The link tasks a checkpoint answers on `store`: those it was trained on there, else (a store of another
    name) all of them; none without a link head."""
    if getattr(loaded.model, "link", None) is None:
        return []
    names = [t.name for t in store.link_tasks]
    trained = [n for n in names if loaded.trained_on(store.name, n)]
    return trained or names


def target_column(store: Any, task: str) -> str:
    """The name of the target-key column: the target table's primary key, `target_<name>` when the anchor table's
    key, `observation_time`, `rank` or `score` has that name."""
    info = store.link_task(task)
    name = store.table(info.target_table).primary_key or "target"
    taken = {store.table(info.anchor_table).primary_key or "anchor", "observation_time", "rank", "score"}
    return f"target_{name}" if name in taken else name


def describe_link_task(store: Any, task: str) -> str:
    """What a link task asks, in words."""
    info = store.link_task(task)
    return (f"rank the {info.target_table} rows a {info.anchor_table} row links to within "
            f"{info.horizon_us / 86_400e6:g} days (top {info.k})")


class LinkAnswerer:
    """A checkpoint's link head bound to one link task of a store and calibrated once (ConfluenceError naming the
    reason when it cannot be: no link head, nothing to calibrate on); `rank` answers any anchors, one call at a
    time (the service's request threads share it)."""

    def __init__(self, loaded: Any, store: Store, task: str, calibrate_seeds: int | None = None):
        from confluence.inference.links import LinkRanker

        self.store, self.task = store, task
        self.info = store.link_task(task)
        self.ranker = LinkRanker(loaded, store, task)
        try:
            self.ranker.calibrate(calibrate_seeds)
        except BaseException:
            self.ranker.close()
            raise
        self._lock = threading.Lock()
        self._target_keys = store.keys(self.info.target_table) if hasattr(store, "keys") else None

    def target_keys(self, rows: np.ndarray) -> pa.Array:
        """Primary keys of target rows `rows` (global; the table's keys read once)."""
        first = int(self.store.table(self.info.target_table).row_offset)
        local = pa.array(np.asarray(rows, dtype=np.int64) - first)
        return local if self._target_keys is None else pc.take(self._target_keys, local)

    def close(self) -> None:
        with self._lock:  # after a rank in progress
            self.ranker.close()

    def rank(self, rows: np.ndarray, obs: np.ndarray, k: int | None = None,
             advance: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """[n, k] global target rows (likeliest first, -1 pads) and [n, k] their chances (NaN pads) for anchor rows
        `rows` (global) at observation times `obs` (epoch µs); `k`: default the task's. In chunks of whole ranker
        batches (the same answer as one call), `advance(anchors)` after each."""
        k = k or self.info.k
        rows, obs = np.asarray(rows, dtype=np.int64), np.asarray(obs, dtype=np.int64)
        out_rows = np.full((len(rows), k), -1, dtype=np.int64)
        out_p = np.full((len(rows), k), np.nan)
        step = self.ranker.source.batch_size * CHUNK_BATCHES
        with self._lock:
            for lo in range(0, len(rows), step):
                r, p = self.ranker.rank_at(rows[lo:lo + step], obs[lo:lo + step], k)
                out_rows[lo:lo + len(r)], out_p[lo:lo + len(r)] = r, p
                if advance is not None:
                    advance(len(r))
        return out_rows, out_p


def _target_keys(store: Any, task: str, rows: np.ndarray, answerer: LinkAnswerer | None) -> pa.Array:
    from confluence.evaluation.predict import anchor_keys

    if answerer is not None:
        return answerer.target_keys(rows)
    return anchor_keys(store, store.link_task(task).target_table, rows)


def link_table(store: Any, task: str, keys: pa.Array, obs: np.ndarray, rows: np.ndarray, chances: np.ndarray,
               answerer: LinkAnswerer | None = None) -> pa.Table:
    """The long table (module doc) of anchors `keys` at `obs` (epoch µs) ranked as `rows` / `chances` [n, k]
    (`answerer`: the one that ranked them, whose target keys are read once)."""
    from confluence.evaluation.predict import _times

    info = store.link_task(task)
    valid = rows >= 0
    per = valid.sum(axis=1)
    anchor_of = np.repeat(np.arange(len(rows)), per)
    rank = np.concatenate([np.arange(1, c + 1) for c in per]) if len(per) else np.zeros(0, np.int64)
    pk = store.table(info.anchor_table).primary_key or "anchor"
    table = pa.table({pk: pc.take(keys, pa.array(anchor_of, pa.int64())),
                      "observation_time": _times(np.asarray(obs, np.int64)[anchor_of]),
                      "rank": pa.array(rank, pa.int32()),
                      target_column(store, task): _target_keys(store, task, rows[valid], answerer),
                      "score": pa.array(chances[valid], pa.float64())})
    meta = {"task": task, "k": int(rows.shape[1]), "anchors": len(rows), "target_table": info.target_table}
    return table.replace_schema_metadata({LINK_METADATA_KEY: json.dumps(meta).encode()})


def link_summary(table: pa.Table) -> dict[str, Any] | None:
    """What a link task's prediction table answers (task, k, anchors, target_table), or None for a cell task's."""
    raw = (table.schema.metadata or {}).get(LINK_METADATA_KEY)
    return None if raw is None else json.loads(raw)


def link_json_rows(store: Any, task: str, keys: pa.Array, obs: np.ndarray, rows: np.ndarray, chances: np.ndarray,
                   answerer: LinkAnswerer | None = None) -> list[dict[str, Any]]:
    """The service's answer: per anchor, in order, its key, `observation_time` (ISO 8601, null: no cut-off), and
    the lists of target keys (likeliest first) and their scores."""
    from confluence.evaluation.predict import _times

    info = store.link_task(task)
    pk = store.table(info.anchor_table).primary_key or "anchor"
    tk = target_column(store, task)
    valid = rows >= 0
    flat = _target_keys(store, task, rows[valid], answerer).to_pylist()
    times = _times(np.asarray(obs, np.int64)).to_pylist()
    out, at = [], 0
    for i, key in enumerate(keys.to_pylist()):
        n = int(valid[i].sum())
        out.append({pk: key, "observation_time": None if times[i] is None else times[i].isoformat(),
                    tk: flat[at:at + n], "score": [float(x) for x in chances[i, :n]]})
        at += n
    return out


def seed_anchors(store: Any, task: str, split: str, max_seeds: int | None) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(global anchor rows, observation times, anchor keys) of a link task's seeds of `split` (at most
    `max_seeds`, a fixed draw, as `evaluate` scores them)."""
    from confluence.evaluation.predict import anchor_keys
    from confluence.sampler.links import link_split_ids
    from confluence.sampler.splits import subsample

    arr = store.link_arrays(task)
    ids = subsample(link_split_ids(store, task, split), max_seeds)
    rows = np.asarray(arr.anchor_row)[ids]
    return rows, np.asarray(arr.obs_time)[ids], anchor_keys(store, store.link_task(task).anchor_table, rows)


def check_cell_only(task: str, **given: Any) -> None:
    """A ConfluenceError naming the first cell-task-only option given (`CELL_ONLY`) for link task `task`."""
    for name in CELL_ONLY:
        if given.get(name):
            raise ConfluenceError(f"--{name.replace('_', '-')} is for cell tasks; {task!r} is a link task")


def predict_links(checkpoint: str | Path | Any, db: str | Path | Store, task: str, *, split: str | None = "test",
                  anchors: str | Path | None = None, out: str | Path | None = None, max_seeds: int | None = None,
                  k: int | None = None, observation_time: str | None = None, progress: Any = None,
                  calibrate_seeds: int | None = None, answerer: LinkAnswerer | None = None) -> pa.Table:
    """A link task's rankings (module doc) for a split of its seeds or the anchors of a file (read as
    `predict.read_anchor_file` reads them: the anchor key column or `key`, and `observation_time` or
    `observation_time` = "row" | "latest" | ISO 8601 time for those without one). Writes `out` (.parquet /
    .csv) atomically when given; returns the table. `k`: target rows per anchor (default: the task's). Bad
    arguments are refused before the model loads; a checkpoint without a link head is refused by name.
    `answerer`: an already calibrated one of this task (the checkpoint is then not loaded)."""
    from confluence.evaluation.predict import read_anchor_file, table_format, write_table_atomic
    from confluence.inference.predictor import load_model
    from confluence.sampler.splits import split_index

    out_path = None if out is None else Path(out)
    if out_path is not None:
        table_format(out_path)
    for name, value in (("top_k", k), ("max_seeds", max_seeds)):
        if value is not None and value < 1:
            raise ConfluenceError(f"{name} (--{name.replace('_', '-')}) must be 1 or more for a link task, not "
                                  f"{value}")
    store = db if isinstance(db, Store) else Store.open(db)
    store.link_task(task)  # an unknown link task, named with the store's
    if anchors is None:
        split_index(split or "test")
        rows, obs, keys = seed_anchors(store, task, split or "test", max_seeds)
    else:
        rows, obs, keys = read_anchor_file(Path(anchors), store, task, observation_time)
    own = answerer is None
    if own:
        loaded = checkpoint if hasattr(checkpoint, "model") else load_model(checkpoint)
        if progress is not None:
            progress.step(f"{task}: calibrate the ranker", 1)
        answerer = LinkAnswerer(loaded, store, task, calibrate_seeds)
        if progress is not None:
            progress.advance(1)
    try:
        if progress is not None:
            progress.step(f"predict {task}", len(rows))
        ranked, chances = answerer.rank(rows, obs, k, None if progress is None else progress.advance)
    finally:
        if own:
            answerer.close()
    table = link_table(store, task, keys, obs, ranked, chances, answerer)
    if out_path is not None:
        write_table_atomic(table, out_path)
    return table
