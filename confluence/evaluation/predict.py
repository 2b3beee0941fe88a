"""`predict`: a table of predictions for a task's anchor rows, post-processed as seed 004 says.

For every requested (anchor, observation time): the anchor's primary key, `observation_time`, `prediction` and the
null head's `p_null` (the prediction is NULL when p_null > 0.5), plus per target type:

- numerical: the de-normalized value, rounded and clipped as the train split's targets imply
  (`targets.numerical_predictions`: a count is never negative or fractional); no confidence column, since the
  model gives no uncertainty for a number (1 - p_null would read as certainty);
- boolean: `p_true` and `confidence` (the probability of the reported value, times 1 - p_null);
- categorical: `confidence` (the top class's probability) and the `top_k` most probable classes as flat columns
  `class_1, prob_1, ..., class_k, prob_k` (probabilities times 1 - p_null);
- timestamp: the datetime of the de-normalized epoch component; `pred_hour`, `pred_weekday` (Monday = 0),
  `pred_day_of_month`, `pred_month` are that datetime's own calendar fields, and `est_hour_of_day`, `est_weekday`,
  `est_day_of_month`, `est_month` the cyclic heads' separate estimates (they can disagree with the datetime).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.evaluation.link_predict import anchor_table_of, check_cell_only, is_link_task, predict_links
from confluence.inference.draws import DEFAULT_DRAWS
from confluence.inference.predictor import HeadOutputs, LoadedModel, Predictor, load_model
from confluence.sampler.splits import split_index, subsample
from confluence.store import Store
from confluence.store.format import NO_CUTOFF
from confluence.stypes import SemanticType
from confluence.targets import kind, sigmoid
from confluence.toolkit.progress import per_row

TABLE_SUFFIXES = (".parquet", ".csv")


def table_format(path: Path, what: str = "output") -> str:
    """'parquet' or 'csv' by the file's suffix; a ConfluenceError for any other suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ConfluenceError(f"{path}: unknown {what} format {suffix or '(no suffix)'!r}; "
                              f"use a .parquet or .csv file")
    return suffix[1:]


def require_task(store: Store, task: str) -> None:
    """A ConfluenceError naming the store and its tasks (and link tasks) when `task` is none of them."""
    names = [t.name for t in store.tasks]
    links = [t.name for t in store.link_tasks]
    if task not in names + links:
        raise ConfluenceError(f"no task {task!r} in {store.path}; tasks: {', '.join(names) or 'none'}"
                              + (f"; link tasks: {', '.join(links)}" if links else ""))


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


def postprocess(store: Any, task: str, out: HeadOutputs, *, train_ids: np.ndarray | None = None,
                top_k: int = 3) -> dict[str, pa.Array]:
    """Head outputs -> the prediction columns in the user's units (module docstring). `train_ids`: the task's train
    seeds, whose targets bound numerical predictions (none when None); `top_k`: classes listed for a categorical
    target."""
    info = store.task(task)
    p_null = sigmoid(out.null_logit)
    is_null = p_null > 0.5
    cols = kind(info.target_stype).output_columns(store, info, out, p_null, is_null, train_ids, top_k)
    cols["p_null"] = pa.array(p_null)
    return cols


def _row_name(path: Path, i: int) -> str:
    """How errors name data row `i` (from 0) of an anchors file: the line of a CSV (header on line 1), the row of
    a Parquet file."""
    return f"{path}: line {i + 2}" if path.suffix.lower() == ".csv" else f"{path}: row {i} (counting from 0)"


def _read_table(path: Path) -> pa.Table:
    fmt = table_format(path, "anchors file")
    if not path.is_file():
        raise ConfluenceError(f"{path}: no such anchors file")
    try:
        return pq.read_table(path) if fmt == "parquet" else pacsv.read_csv(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfluenceError(f"{path}: unreadable {fmt} file ({exc})") from None


def _to_times(col: pa.Array) -> pa.Array:
    """`col` as naive UTC timestamps[us]; strings may carry a zone offset (converted to UTC). Raises Arrow's
    error when a value is no time."""
    if pa.types.is_timestamp(col.type) or not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return col.cast(pa.timestamp("us"))
    try:
        return col.cast(pa.timestamp("us"))
    except pa.ArrowInvalid:  # ISO 8601 with a zone offset ("Z", "+02:00"), possibly beside naive values
        try:
            return col.cast(pa.timestamp("us", tz="UTC")).cast(pa.timestamp("us"))
        except pa.ArrowInvalid:
            if len(col) == 1:
                raise
            return pa.concat_arrays([_to_times(col.slice(i, 1)) for i in range(len(col))])


_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError)


def _convert(col: pa.Array, convert: Callable[[pa.Array], pa.Array], bad_value: Callable[[int], str],
             bad_type: str) -> pa.Array:
    """`convert(col)`; when Arrow cannot, a ConfluenceError naming the first value that fails on its own
    (`bad_value(i)`), or `bad_type` when each converts alone."""
    try:
        return convert(col)
    except _CAST_ERRORS:
        for i in range(len(col)):
            try:
                convert(col.slice(i, 1))
            except _CAST_ERRORS:
                raise ConfluenceError(bad_value(i)) from None
        raise ConfluenceError(bad_type) from None


def observation_times(col: pa.Array, where: Callable[[int], str]) -> np.ndarray:
    """An `observation_time` column (timestamps, dates, or ISO 8601 strings with or without a zone offset) as epoch
    µs, NULL -> no cut-off. A value that is no time raises a ConfluenceError naming its place, `where(i)`."""
    times = _convert(col, _to_times, lambda i: f"{where(i)}: observation_time {col[i].as_py()!r} is not a timestamp",
                     f"column 'observation_time' of type {col.type} is not a timestamp")
    return np.asarray(times.cast(pa.int64()).fill_null(NO_CUTOFF).to_numpy(zero_copy_only=False), np.int64)


def _cast_keys(keys: pa.Array, to: pa.DataType, table: str, where: Callable[[int], str]) -> pa.Array:
    """Keys as the store's key type; a ConfluenceError names the first key that cannot be one."""
    if keys.type == to:
        return keys
    return _convert(keys, lambda k: k.cast(to),
                    lambda i: f"{where(i)}: key {keys[i].as_py()!r} cannot be a key of '{table}' (its keys are {to})",
                    f"keys of type {keys.type} cannot be keys of '{table}' (its keys are {to})")


class KeyIndex:
    """A table's primary-key values sorted once, to find the rows of given keys. `resolve_anchors` builds one per
    call; the prediction service keeps one per table (hashing 336,776 flight ids took 35 ms a request)."""

    def __init__(self, keys: pa.Array):
        self.type = keys.type
        values = self._values(keys)
        self._order = np.argsort(values, kind="stable")  # equal keys: the first row wins, as pc.index_in
        self._sorted = values[self._order]

    def _values(self, keys: pa.Array) -> np.ndarray:
        if pa.types.is_integer(self.type):
            return np.asarray(keys.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        return np.asarray(keys.fill_null("").to_numpy(zero_copy_only=False)).astype(str)

    def rows(self, keys: pa.Array) -> np.ndarray:
        """Local row of each key (of this index's type), -1 where a key is NULL or not in the table."""
        q = self._values(keys)
        if not len(self._sorted):
            return np.full(len(q), -1, np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, q), len(self._sorted) - 1)
        hit = (self._sorted[pos] == q) & keys.is_valid().to_numpy(zero_copy_only=False)
        return np.where(hit, self._order[pos], -1).astype(np.int64)


def resolve_anchors(store: Any, task: str, keys: pa.Array, times: pa.Array | None,
                    where: Callable[[int], str], *, null_time_default: bool = False,
                    index: KeyIndex | None = None) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Anchors named by primary key (and optional observation times) -> (global rows, observation times in epoch
    µs, keys as the store types them). The one path of `--anchors` files and of the prediction service:
    `where(i)` names anchor `i` in errors (a file's line, a request's `anchors[i]`). Without times, the cascade:
    the anchor row's own time, else no cut-off. A NULL time is no cut-off (a file's empty cell), or with
    `null_time_default` the cascade's time for that anchor (a request's anchor without a time). `index`: the
    anchor table's `KeyIndex`, when the caller keeps one."""
    table = store.table(anchor_table_of(store, task))
    if index is None:
        store_keys = store.keys(table.name) if hasattr(store, "keys") else None
        if store_keys is None:
            raise ConfluenceError(f"store {store.name!r} does not record primary-key values; re-run preprocess")
        index = KeyIndex(store_keys)
    keys = _cast_keys(keys, index.type, table.name, where)
    local = index.rows(keys)
    missing = np.flatnonzero(local < 0)
    if len(missing):
        i = int(missing[0])
        what = "has no key" if not keys[i].is_valid else f"key {keys[i].as_py()!r} is not a '{table.name}' row"
        raise ConfluenceError(f"{where(i)}: {what} ({len(missing)} unknown key(s))")
    rows = local.astype(np.int64) + int(table.row_offset)
    if table.temporal_column:
        default = np.asarray(store.row_time)[rows]  # the cascade: the anchor row's own time
    else:
        default = np.full(len(rows), NO_CUTOFF, np.int64)
    obs = default
    if times is not None:
        obs = observation_times(times, where)
        if null_time_default:
            obs = np.where(times.is_null().to_numpy(zero_copy_only=False), default, obs)
    return rows, np.asarray(obs, dtype=np.int64), keys


# whose labels a labelled context may show: what an evaluation of that split reads, or every label known by then
LABEL_SCOPES = ("train", "val", "test", "all")


def read_anchor_file(path: Path, store: Any, task: str, observation_time: str | None = None
                     ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Anchors named by the user: a Parquet / CSV file with the anchor table's primary-key column (or `key`) and
    an `observation_time` column. Returns (global rows, observation times, keys). Errors name the CSV line (header
    on line 1) or the Parquet row.

    Every anchor needs an explicit time: an empty cell (or no column) is an error, unless `observation_time`
    says what it means: "row" (the anchor row's own time; no cut-off for a table without time), "latest" (no
    cut-off: the context may show every row of the store, the future of that row included) or an ISO 8601 time.
    (Before, an empty cell silently meant no cut-off: a row that saw its own future.)"""
    path = Path(path)
    table = store.table(anchor_table_of(store, task))
    t = _read_table(path)
    key_col = table.primary_key if table.primary_key in t.column_names else "key"
    if key_col not in t.column_names:
        raise ConfluenceError(f"{path}: needs a column '{table.primary_key}' (or 'key') with anchor keys of "
                              f"'{table.name}'; it has {t.column_names}")
    keys = t.column(key_col).combine_chunks()
    where = lambda i: _row_name(path, i)  # noqa: E731
    times = t.column("observation_time").combine_chunks() if "observation_time" in t.column_names else None
    if times is not None and (pa.types.is_string(times.type) or pa.types.is_large_string(times.type)):
        times = pa.array([None if v is None or not v.strip() else v for v in times.to_pylist()], pa.string())
    blank = np.ones(len(keys), bool) if times is None else times.is_null().to_numpy(zero_copy_only=False)
    if blank.any() and observation_time is None:
        first = int(np.flatnonzero(blank)[0])
        what = f"{path}: has no 'observation_time' column" if times is None else \
            f"{where(first)}: observation_time is empty ({int(blank.sum())} such row(s))"
        raise ConfluenceError(f"{what}; give every anchor its time, or pass --observation-time row (each anchor "
                              "row's own time), latest (no cut-off: every row of the store, its future included) or "
                              "an ISO 8601 time")
    rows, obs, cast_keys = resolve_anchors(store, task, keys, times, where, null_time_default=True)
    if blank.any():
        obs = np.where(blank, default_times(store, task, rows, observation_time), obs)
    return rows, obs, cast_keys


def default_times(store: Any, task: str, rows: np.ndarray, observation_time: str) -> np.ndarray:
    """The observation time (epoch µs) `--observation-time` gives anchor rows: "row" (each row's own time; no
    cut-off for a table without time), "latest" (no cut-off) or one ISO 8601 time for all."""
    table = store.table(anchor_table_of(store, task))
    if observation_time == "row":
        if not table.temporal_column:
            return np.full(len(rows), NO_CUTOFF, np.int64)
        return np.asarray(np.asarray(store.row_time)[rows], np.int64)
    if observation_time == "latest":
        return np.full(len(rows), NO_CUTOFF, np.int64)
    one = observation_times(pa.array([observation_time], pa.string()),
                            lambda i: f"--observation-time {observation_time!r}")
    return np.full(len(rows), int(one[0]), np.int64)


def prediction_table(store: Any, task: str, keys: pa.Array, obs: np.ndarray, head: HeadOutputs, *,
                     train_ids: np.ndarray | None, top_k: int = 3) -> pa.Table:
    """The table `predict` returns: the anchor table's primary key (named as there), `observation_time`, then the
    prediction columns of `postprocess`."""
    pk = store.table(store.task(task).anchor_table).primary_key or "anchor"
    return pa.table({pk: keys, "observation_time": _times(obs),
                     **postprocess(store, task, head, train_ids=train_ids, top_k=top_k)})


def seed_prediction_table(store: Any, task: str, seed_ids: np.ndarray, head: HeadOutputs, *,
                          train_ids: np.ndarray | None, top_k: int = 3) -> pa.Table:
    """`prediction_table` for seeds of the task (their anchors' keys and observation times): what `predict --split`
    writes, also from head outputs computed elsewhere (the demo reuses its evaluation's)."""
    arrays = store.task_arrays(task)
    ids = np.asarray(seed_ids, dtype=np.int64)
    keys = anchor_keys(store, store.task(task).anchor_table, np.asarray(arrays.anchor_row)[ids])
    return prediction_table(store, task, keys, np.asarray(arrays.obs_time)[ids], head, train_ids=train_ids,
                            top_k=top_k)


def predict(
    checkpoint: str | Path | LoadedModel,
    db: str | Path | Store,
    task: str,
    *,
    split: str | None = "test",
    anchors: str | Path | None = None,
    out: str | Path | None = None,
    batch_size: int | None = None,
    threads: int | None = None,
    max_seeds: int | None = None,
    top_k: int | None = None,
    progress: Any = None,
    clip_numbers: bool = True,
    draws: int = DEFAULT_DRAWS,
    context_labels: str | None = None,
    observation_time: str | None = None,
    blend: str | None = None,
    blend_max_val: int = 5000,
    explain: int = 0,
    certify: int = 0,
) -> pa.Table:
    """Predictions for a split of a task's seeds, or for the anchors in a file. Writes `out` (.parquet / .csv)
    atomically when given; returns the table. `progress`: a `Reporter`-like object (`step(desc, total)`,
    `advance(n)`). `clip_numbers=False` reports numbers plainly de-normalized (seed 004), not clipped to the train
    targets' range and rounded (`targets.numerical_predictions`). `draws`: contexts per anchor whose answers are
    combined (`inference.combine_draws`; 1: one context). `context_labels`: whose labels a labelled context may
    show ("train", "val", "test": what an evaluation of that split reads; "all": every label known at the
    observation time); default: the split's for `split`, "all" for `anchors` (as the service). The same anchor,
    observation time and `context_labels` give the same prediction by either path (docs/design/evaluation.md, "One
    answer per question"). `observation_time`: what an anchors file's missing times mean (`read_anchor_file`).
    `blend="gbdt"`: also LightGBM's and the blend's columns (`blend_columns`), LightGBM fitted on the train
    seeds and the weight chosen on at most `blend_max_val` validation seeds (`confluence.evaluation.blend`); the
    table's schema metadata `confluence.blend` holds the fit (weight, validation scores, what to ship).
    `explain` > 0 adds the column `explanation`: per row, JSON of the context rows that moved the prediction most
    (that many) and their cells (`confluence.inference.explain`). `certify` > 0 checks up to that many of the
    predicted anchors for leakage (`confluence.evaluation.certify.certify_task`: their contexts rebuilt with every
    later cell and every unknown label randomized must be bit-identical) and puts the certificate in the table's
    schema metadata `confluence.certificate` (`certificate_of`); a leak is reported there, not raised. Bad arguments (output suffix, task, split, anchors file, label scope) are refused before the model loads.
    `top_k`: classes listed for a categorical task (None: 3). A link task answers `link_predict.predict_links`'
    table instead (`top_k` target rows per anchor, None: the task's k); `blend`, `explain`, `certify` and
    `context_labels` are refused for it, `draws`, `clip_numbers`, `batch_size` and `threads` do not apply."""
    out_path = None if out is None else Path(out)
    if out_path is not None:
        table_format(out_path)
    for name, value, least in (("top_k", top_k, 0), ("max_seeds", max_seeds, 1), ("batch_size", batch_size, 1),
                               ("threads", threads, 1), ("draws", draws, 1), ("explain", explain, 0),
                               ("certify", certify, 0)):
        if value is not None and value < least:
            raise ConfluenceError(f"{name} (--{name.replace('_', '-')}) must be {least} or more, not {value}")
    from confluence.evaluation.blend import check_blend

    check_blend(blend)
    store = db if isinstance(db, Store) else Store.open(db)
    require_task(store, task)
    if is_link_task(store, task):
        check_cell_only(task, blend=blend, explain=explain, certify=certify, context_labels=context_labels)
        return predict_links(checkpoint, store, task, split=split, anchors=anchors, out=out, max_seeds=max_seeds,
                             k=top_k, observation_time=observation_time, progress=progress)
    top_k = 3 if top_k is None else top_k
    if anchors is None:
        split_index(split or "test")  # an unknown split is named as such, before the label scope it implies
    context = context_labels or ("all" if anchors is not None else split or "test")
    if context not in LABEL_SCOPES:
        raise ConfluenceError(f"context labels (--context-labels) must be one of {', '.join(LABEL_SCOPES)}, not "
                              f"{context!r}")
    if anchors is not None:
        rows, obs, keys = read_anchor_file(Path(anchors), store, task, observation_time)
    loaded = checkpoint if isinstance(checkpoint, LoadedModel) else load_model(checkpoint)
    predictor = Predictor(loaded, store, batch_size=batch_size, threads=threads, draws=draws)
    try:
        if anchors is None:
            ids = subsample(predictor.seed_ids(split or "test", task), max_seeds)
        if progress is not None:  # counted in rows, whatever the contexts drawn per row
            progress.step(f"predict {task}", len(ids) if anchors is None else len(rows))
        advance = None if progress is None else per_row(progress.advance, predictor.draws)
        if anchors is not None:
            head = predictor.anchor_outputs(task, rows, obs, advance, context=context)
        else:
            head = predictor.task_outputs(task, ids, advance, context=context)
        train_ids = predictor.seed_ids("train", task) if clip_numbers else None
        if blend:
            targets = (ids, None) if anchors is None else (rows, obs)
            blend_cols, fit = blend_for_rows(predictor, task, targets, head, max_val=blend_max_val,
                                             clip_numbers=clip_numbers, progress=progress)
        if explain:
            explained = explanation_column(predictor, task, explain, (ids, None) if anchors is None else (rows, obs),
                                           context, progress)
    finally:
        predictor.close()
    if anchors is None:
        table = seed_prediction_table(store, task, ids, head, train_ids=train_ids, top_k=top_k)
    else:
        table = prediction_table(store, task, keys, obs, head, train_ids=train_ids, top_k=top_k)
    if blend:
        for name, col in blend_cols.items():
            table = table.append_column(name, col)
        summary = fit.summary() | {"ship": fit.ship}
        if anchors is None and (split or "test") == "val":
            summary["note"] = "; ".join(([fit.note] if fit.note else [])
                                        + ["the predicted rows are the validation rows the weight was chosen on"])
        from confluence.evaluation.evaluate import clean_json

        meta = dict(table.schema.metadata or {}) | {BLEND_METADATA_KEY: json.dumps(clean_json(summary)).encode()}
        table = table.replace_schema_metadata(meta)
    if explain:
        table = table.append_column("explanation", explained)
    if certify:
        cert = _certificate(loaded, store, task, certify, context,
                            (ids, None) if anchors is None else (rows, obs), progress)
        meta = dict(table.schema.metadata or {}) | {CERTIFICATE_METADATA_KEY: json.dumps(cert).encode()}
        table = table.replace_schema_metadata(meta)
    if out_path is not None:
        write_table_atomic(table, out_path)
    return table


def explanation_column(predictor: Predictor, task: str, top: int, targets: tuple[np.ndarray, np.ndarray | None],
                       context: str, progress: Any = None) -> pa.Array:
    """`predict(explain=...)`'s column: each row's explanation as JSON text (`Explanation.to_dict`), for
    (seed ids, None) of the task or (global anchor rows, observation times)."""
    from confluence.inference.explain import Explainer

    ex = Explainer(predictor, task, top=top)
    ids, obs = targets
    if progress is not None:
        progress.step(f"explain {task}", len(ids))
    advance = None if progress is None else progress.advance
    out = ex.seeds(ids, context, advance) if obs is None else ex.anchors(ids, obs, context, advance)
    return pa.array([json.dumps(e.to_dict()) for e in out], pa.string())


CERTIFICATE_METADATA_KEY = b"confluence.certificate"  # schema metadata of a `predict(certify=...)` table, JSON


def _certificate(loaded: LoadedModel, store: Store, task: str, most: int, context: str,
                 targets: tuple[np.ndarray, np.ndarray | None], progress: Any = None) -> dict[str, Any]:
    """The leakage certificate of up to `most` of the predicted anchors (spread over them): its summary, digest and
    `passed`."""
    from confluence.evaluation.certify import certificate_digest, certify_task

    ids, obs = targets
    at = subsample(np.arange(len(ids), dtype=np.int64), most)
    if progress is not None:
        progress.step(f"{task}: leakage certificate", 1)
    cfg = loaded.config
    if obs is None:
        cert = certify_task(store, cfg.sampler, task, np.asarray(ids)[at], run_seed=cfg.seed, context=context)
    else:
        cert = certify_task(store, cfg.sampler, task, at, run_seed=cfg.seed, context=context, anchors=(ids, obs))
    return {**cert.summary(), "passed": cert.passed, "digest": certificate_digest({task: cert}, store.name)}


def certificate_of(table: pa.Table) -> dict[str, Any] | None:
    """The certificate a `predict(certify=...)` table carries (None without one)."""
    raw = (table.schema.metadata or {}).get(CERTIFICATE_METADATA_KEY)
    return None if raw is None else json.loads(raw)


BLEND_METADATA_KEY = b"confluence.blend"  # schema metadata of a `predict(blend=...)` table: the blend's fit, JSON


@dataclass
class TaskBlend:
    """The blend of one task, fitted once (`fit_task_blend`) and applied to any rows the model answers: LightGBM
    (`gbdt`, fitted on the train seeds), the weight and ship choice (`fit`, chosen on validation seeds), and the
    train targets' range that bounds blended numbers (None: not clipped)."""

    task: str
    gbdt: Any  # gbdt.GBDTModel
    fit: Any  # blend.BlendFit
    target_range: Any  # targets.TargetRange | None
    clip_numbers: bool = True
    trivial: Any = None  # trivial.TrivialFit: the baselines the floor compared with, for new rows

    def gbdt_predictions(self, builder: Any, targets: tuple[np.ndarray, np.ndarray | None],
                         progress: Any = None) -> np.ndarray:
        """LightGBM's predictions for `targets`: (seed ids, None) for seeds of the task, or (global anchor rows,
        observation times) for anchors (`FeatureBuilder.build_anchors`)."""
        ids, obs = targets
        what = f"{self.task}: LightGBM features of {len(ids)} {'seeds' if obs is None else 'anchors'} to predict"
        features = builder.build(self.task, ids, progress, what) if obs is None else \
            builder.build_anchors(self.task, ids, obs, progress, what)
        return self.gbdt.predict(features)

    def columns(self, predictor: Predictor, head: HeadOutputs, gbdt_pred: np.ndarray,
                targets: tuple[np.ndarray, np.ndarray | None]) -> dict[str, pa.Array]:
        """`blend_columns` for the rows `head` (the model's outputs) and `gbdt_pred` (LightGBM's) answer, with the
        trivial baseline's (`trivial_columns`) where one was fitted. `targets`: as for `gbdt_predictions`."""
        from confluence.evaluation.blend import blend_predictions
        from confluence.evaluation.evaluate import model_point_predictions

        store = predictor.store
        stype = SemanticType(int(store.task(self.task).target_stype))
        model_pred = model_point_predictions(predictor, self.task, head, np.ones(len(head.null_logit), bool),
                                             self.clip_numbers)
        blended = blend_predictions(stype, model_pred, gbdt_pred, self.fit.weight, target_range=self.target_range)
        cols = blend_columns(store, self.task, head, gbdt_pred, blended, self.fit.weight)
        return cols | self.trivial_columns(store, targets)

    def trivial_columns(self, store: Any, targets: tuple[np.ndarray, np.ndarray | None]) -> dict[str, pa.Array]:
        """The best trivial baseline on validation (`fit.trivial_name`) for `targets`, as LightGBM's columns are
        written with `trivial_` for `gbdt_` (`trivial_prediction`, with `trivial_p_true` or `trivial_confidence`);
        none where no baseline was compared (or it cannot answer these rows: a median wait without their
        observation times)."""
        from confluence.evaluation.trivial import seed_obs

        name = self.fit.trivial_name
        if self.trivial is None or name is None:
            return {}
        ids, obs = targets
        preds = self.trivial.predictions(len(ids), seed_obs(store, self.task, ids) if obs is None else obs)
        if name not in preds:
            return {}
        info = store.task(self.task)
        n = len(ids)
        cols = kind(info.target_stype).blend_columns(store, info, preds[name], preds[name], np.zeros(n),
                                                     np.zeros(n, bool))
        return {"trivial" + k[len("gbdt"):]: v for k, v in cols.items() if k.startswith("gbdt_")}


def fit_task_blend(predictor: Predictor, task: str, builder: Any, *, max_val: int = 5000,
                   clip_numbers: bool = True, progress: Any = None) -> TaskBlend:
    """Fit one task's blend: LightGBM on its train seeds, then the weight on at most `max_val` validation seeds,
    which the model answers with validation contexts (train labels only) and LightGBM never trains on
    (`confluence.evaluation.blend.fit_blend`). `builder`: the store's `gbdt.FeatureBuilder`."""
    from confluence.evaluation.blend import fit_blend
    from confluence.evaluation.evaluate import model_point_predictions
    from confluence.evaluation.gbdt import predict_seeds, train_gbdt
    from confluence.evaluation.trivial import fit_trivial, seed_obs
    from confluence.targets import decode_targets, train_target_range

    store = predictor.store
    stype = SemanticType(int(store.task(task).target_stype))
    train_ids = predictor.seed_ids("train", task)
    model = train_gbdt(store, task, train_ids, builder=builder, progress=progress)
    val_ids = subsample(predictor.seed_ids("val", task), max_val)
    val = decode_targets(store, task, val_ids)
    keep_val = ~val.is_null
    gbdt_val = predict_seeds(model, builder, val_ids, progress, "validation")
    if keep_val.any():
        if progress is not None:
            progress.step(f"{task}: model on validation seeds (blend weight)", len(val_ids))
        out_val = predictor.task_outputs(task, val_ids, None if progress is None else
                                         per_row(progress.advance, predictor.draws), context="val")
        model_val = model_point_predictions(predictor, task, out_val, keep_val, clip_numbers)
    else:
        model_val = np.zeros((0,) + np.shape(gbdt_val)[1:])
    rng = train_target_range(store, task, train_ids) if clip_numbers else None
    trivial = fit_trivial(store, task, train_ids, num_classes=val.num_classes or None)
    fit = fit_blend(stype, val.values[keep_val], model_val, gbdt_val, target_range=rng,
                    trivial=trivial.predictions(int(keep_val.sum()), seed_obs(store, task, val_ids[keep_val])))
    return TaskBlend(task=task, gbdt=model, fit=fit, target_range=rng, clip_numbers=clip_numbers, trivial=trivial)


def blend_for_rows(predictor: Predictor, task: str, targets: tuple[np.ndarray, np.ndarray | None],
                   head: HeadOutputs, *, max_val: int = 5000, clip_numbers: bool = True,
                   progress: Any = None) -> tuple[dict[str, pa.Array], Any]:
    """LightGBM's and the blend's prediction columns (`blend_columns`) for the rows `head` answers, and the blend's
    `BlendFit` (`fit_task_blend`). `targets`: (seed ids, None) for seeds of the task, or (global anchor rows,
    observation times) for anchors."""
    from confluence.evaluation.gbdt import FeatureBuilder

    builder = FeatureBuilder(predictor.store, progress=progress)
    tb = fit_task_blend(predictor, task, builder, max_val=max_val, clip_numbers=clip_numbers, progress=progress)
    return tb.columns(predictor, head, tb.gbdt_predictions(builder, targets, progress), targets), tb.fit


def blend_columns(store: Any, task: str, head: HeadOutputs, gbdt: np.ndarray, blended: np.ndarray,
                  weight: float) -> dict[str, pa.Array]:
    """The columns `predict --blend gbdt` adds beside the model's: `gbdt_prediction` (LightGBM's value, class or
    time; it never predicts NULL) and `blend_prediction` (NULL where the model's `prediction` is: the model's null
    head decides NULL, LightGBM only predicts values), with `gbdt_p_true` / `blend_p_true` (boolean) or
    `gbdt_confidence` / `blend_confidence` (categorical: the top class's probability, the blend's times
    1 - p_null as the model's), then `blend_weight` (the model's share, the same on every row)."""
    info = store.task(task)
    p_null = sigmoid(head.null_logit)
    is_null = p_null > 0.5
    n = len(p_null)
    cols = kind(info.target_stype).blend_columns(store, info, gbdt, blended, p_null, is_null)
    cols["blend_weight"] = pa.array(np.full(n, float(weight)))
    return cols


def blend_summary(table: pa.Table) -> dict[str, Any] | None:
    """The blend's fit a `predict(blend=...)` table records (weight, validation scores, `ship`), or None."""
    raw = (table.schema.metadata or {}).get(BLEND_METADATA_KEY)
    return None if raw is None else json.loads(raw)


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """Write Parquet (.parquet) or CSV (.csv) into a temporary file and rename it into place."""
    fmt = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if fmt == "parquet":  # marked as confluence's, so a later predict may replace it (outputs.claim_file)
            meta = dict(table.schema.metadata or {}) | {outputs.PARQUET_KEY: b"confluence"}
            pq.write_table(table.replace_schema_metadata(meta), tmp)
        else:
            pacsv.write_csv(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
