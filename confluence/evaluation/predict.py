"""`predict`: a table of predictions for a task's anchor rows, post-processed as seed 004 says.

For every requested (anchor, observation time): the null head first (`p_null`; the prediction is NULL when
p_null > 0.5), then the type-specific head: de-normalized numbers, booleans with the probability of `true`,
the category string with its probability, timestamps decoded to datetimes (the epoch component de-normalized
with the database-wide statistics; calendar fields decoded from the cyclic components are reported beside it).
`confidence` is the probability of the reported value (for numbers and timestamps: 1 - p_null).
"""

from __future__ import annotations

import datetime as dt
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from confluence.errors import ConfluenceError
from confluence.evaluation.inference import HeadOutputs, LoadedModel, Predictor, load_model, sigmoid, softmax
from confluence.evaluation.targets import task_categories
from confluence.store.format import NO_CUTOFF
from confluence.stypes import SemanticType

_EPOCH = dt.datetime(1970, 1, 1)


def anchor_keys(store: Any, table: str, global_rows: np.ndarray) -> pa.Array:
    """Primary-key values of the given rows when the store keeps them, else the rows' local indices."""
    info = store.table(table)
    local = np.asarray(global_rows, dtype=np.int64) - int(info.row_offset)
    keys = store.keys(table) if hasattr(store, "keys") else None
    if keys is None:
        return pa.array(local)
    return pc.take(keys, pa.array(local))


def _times(obs: np.ndarray) -> pa.Array:
    obs = np.asarray(obs, dtype=np.int64)
    return pa.array(obs, pa.timestamp("us"), mask=obs == NO_CUTOFF)


def cyclic_fields(ts15: np.ndarray) -> dict[str, np.ndarray]:
    """Calendar fields decoded from the cyclic pairs (docs/architecture.md): hour, weekday, day of month, month."""
    def angle(pair: int, period: float) -> np.ndarray:
        a = np.arctan2(ts15[:, 2 * pair], ts15[:, 2 * pair + 1]) % (2 * math.pi)
        return a / (2 * math.pi) * period

    return {
        "pred_hour": np.round(angle(2, 24)) % 24,
        "pred_weekday": np.round(angle(3, 7)) % 7,
        "pred_day_of_month": np.round(angle(4, 30.436875)) % 31 + 1,
        "pred_month": np.round(angle(5, 12)) % 12 + 1,
    }


def postprocess(store: Any, task: str, out: HeadOutputs) -> dict[str, pa.Array]:
    """Head outputs -> {prediction, confidence, p_null, ...} columns in the user's units."""
    info = store.task(task)
    stype = SemanticType(int(info.target_stype))
    p_null = sigmoid(out.null_logit)
    is_null = p_null > 0.5
    cols: dict[str, pa.Array] = {}
    if stype == SemanticType.NUMERICAL:
        mean, std = float(info.stats["mean"]), float(info.stats["std"]) or 1.0
        cols["prediction"] = pa.array(out.num_pred.astype(np.float64) * std + mean, mask=is_null)
        conf = 1.0 - p_null
    elif stype == SemanticType.BOOLEAN:
        p = sigmoid(out.bool_logit)
        cols["prediction"] = pa.array(p > 0.5, mask=is_null)
        cols["p_true"] = pa.array(p)
        conf = np.where(p > 0.5, p, 1 - p) * (1 - p_null)
    elif stype == SemanticType.CATEGORICAL:
        probs = softmax(out.cat_logits)
        cats = np.asarray(task_categories(store, info), dtype=object)
        best = probs.argmax(axis=1) if probs.shape[1] else np.zeros(len(p_null), np.int64)
        cols["prediction"] = pa.array(cats[best] if len(cats) else [None] * len(best), pa.string(), mask=is_null)
        conf = (probs[np.arange(len(best)), best] if probs.shape[1] else np.zeros(len(best))) * (1 - p_null)
    else:
        mean, std = store.timestamp_stats
        us = np.round(out.ts_pred[:, 14].astype(np.float64) * std + mean)
        lo, hi = -62_135_596_800_000_000, 253_402_300_799_000_000  # years 1..9999
        cols["prediction"] = pa.array(np.clip(us, lo, hi).astype(np.int64), pa.timestamp("us"), mask=is_null)
        for name, v in cyclic_fields(out.ts_pred).items():
            cols[name] = pa.array(v.astype(np.int64))
        conf = 1.0 - p_null
    cols["confidence"] = pa.array(np.asarray(conf, dtype=np.float64))
    cols["p_null"] = pa.array(p_null)
    return cols


def read_anchor_file(path: Path, store: Any, task: str) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Anchors named by the user: a Parquet / CSV file with the anchor table's primary-key column (or `key`) and an
    optional `observation_time` column. Returns (global rows, observation times, keys)."""
    info = store.task(task)
    table = store.table(info.anchor_table)
    t = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    key_col = table.primary_key if table.primary_key in t.column_names else "key"
    if key_col not in t.column_names:
        raise ConfluenceError(f"{path}: needs a column '{table.primary_key}' (or 'key') with anchor keys of "
                              f"'{table.name}'; it has {t.column_names}")
    keys = t.column(key_col).combine_chunks()
    store_keys = store.keys(table.name) if hasattr(store, "keys") else None
    if store_keys is None:
        raise ConfluenceError(f"store {store.name!r} does not record primary-key values; re-run preprocess")
    if keys.type != store_keys.type:
        try:
            keys = keys.cast(store_keys.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfluenceError(f"{path}: column '{key_col}' has type {keys.type}, expected {store_keys.type}") from exc
    local = np.asarray(pc.fill_null(pc.index_in(keys, value_set=store_keys), -1))
    missing = np.flatnonzero(local < 0)
    if len(missing):
        raise ConfluenceError(f"{path}: row {int(missing[0])}: key {keys[int(missing[0])].as_py()!r} is not a "
                              f"'{table.name}' row ({len(missing)} unknown key(s))")
    rows = local.astype(np.int64) + int(table.row_offset)
    if "observation_time" in t.column_names:
        obs_col = t.column("observation_time").combine_chunks()
        if not pa.types.is_timestamp(obs_col.type):
            obs_col = obs_col.cast(pa.timestamp("us"))
        obs = obs_col.cast(pa.timestamp("us")).cast(pa.int64()).fill_null(NO_CUTOFF).to_numpy()
    elif table.temporal_column:
        obs = np.asarray(store.row_time)[rows]  # the cascade: the anchor row's own time
    else:
        obs = np.full(len(rows), NO_CUTOFF, np.int64)
    return rows, np.asarray(obs, dtype=np.int64), keys


def predict(
    checkpoint: str | Path | LoadedModel,
    db: str | Path,
    task: str,
    *,
    split: str | None = "test",
    anchors: str | Path | None = None,
    out: str | Path | None = None,
    batch_size: int | None = None,
    threads: int = 1,
    max_seeds: int | None = None,
    progress: Any = None,
) -> pa.Table:
    """Predictions for a split of a task's seeds, or for the anchors in a file. Writes `out` (.parquet / .csv)
    atomically when given; returns the table."""
    loaded = checkpoint if isinstance(checkpoint, LoadedModel) else load_model(checkpoint)
    predictor = Predictor(loaded, db, batch_size=batch_size, threads=threads)
    store = predictor.store
    try:
        info = store.task(task)
        if anchors is not None:
            rows, obs, keys = read_anchor_file(Path(anchors), store, task)
            head = predictor.anchor_outputs(task, rows, obs, progress)
        else:
            from confluence.evaluation.evaluate import subsample

            ids = subsample(predictor.seed_ids(split or "test", task), max_seeds)
            arrays = store.task_arrays(task)
            rows = np.asarray(arrays.anchor_row)[ids]
            obs = np.asarray(arrays.obs_time)[ids]
            keys = anchor_keys(store, info.anchor_table, rows)
            head = predictor.task_outputs(task, ids, progress)
    finally:
        predictor.close()
    pk = store.table(info.anchor_table).primary_key or "anchor"
    cols = {pk: keys, "observation_time": _times(obs), **postprocess(store, task, head)}
    table = pa.table(cols)
    if out is not None:
        write_table_atomic(table, Path(out))
    return table


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """Write Parquet (.parquet) or CSV (anything else) into a temporary file and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if path.suffix == ".parquet":
            pq.write_table(table, tmp)
        else:
            pacsv.write_csv(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
