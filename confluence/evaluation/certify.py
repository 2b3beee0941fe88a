"""The leakage certificate (`evaluate --certify`): proof, for one database and its tasks, that no context the model
answers from can read a cell dated after its observation time or a label not yet known at it.

For a sample of each task's seeds, each seed's context (observation time T) is built twice with the run's sampler
settings: once from the database as it is, once from a copy in which every non-key cell of every row dated after T
(rows of temporal tables; a row whose time is NULL counts as after every T) holds a random value of its column (the
value and NULL-ness of another row of that column), and every label of the task not known at T (observation time +
horizon after T) holds a random other seed's. Seeds are taken latest T first, so one copy serves them all, each step
randomizing the rows between two times. A context that reads nothing
from the future is the same array for array, so the model's inputs, and its predictions, are bit-identical; any
difference is a leak, reported with the task, the anchor, the table, row and column it came through.

What it does not prove: the task's own definition (a same-row column that restates the target, a SQL task that
counts events at its observation time) is data the database holds at T, so no perturbation reveals it (the
same-row part is reported as warnings, `same_row_warnings`); and the
structure of the future (how many rows will exist) is left as it is: child rows after T are never walked, which the
sampler's property tests check (tests/test_sampler_walk.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confluence.sampler.config import SamplerConfig
from confluence.sampler.data import SamplerData
from confluence.sampler.labels import VIA_LABEL, label_times, task_horizon
from confluence.sampler.sampler import Sampler
from confluence.sampler.splits import subsample
from confluence.store.format import NO_CUTOFF
from confluence.stypes import SemanticType

FUTURE_CELL = "a cell of a row dated after the observation time"
UNKNOWN_LABEL = "a label not yet known at the observation time"


@dataclass(frozen=True)
class Leak:
    """One context cell that changed when the future was randomized."""

    task: str
    anchor: str  # the anchor row's table and primary key
    observation_time: int  # epoch µs
    table: str
    row: str  # the leaking row's primary key (or local index)
    column: str
    what: str  # FUTURE_CELL, UNKNOWN_LABEL or "other" (a cell whose row is neither)

    def message(self) -> str:
        from confluence.schema.relbench import iso

        return (f"task {self.task!r}, anchor {self.anchor} at {iso(self.observation_time)}: the context read "
                f"{self.what}, {self.table} {self.row} column {self.column!r}")


@dataclass
class TaskCertificate:
    task: str
    seeds: int = 0  # contexts compared
    times: int = 0  # observation times checked (each one exactly: every row after it randomized)
    future_rows: int = 0  # rows randomized by the earliest observation time checked
    unknown_labels: int = 0  # labels randomized by the earliest observation time checked
    leaks: list[Leak] = field(default_factory=list)
    # what the task's own definition lets through (`same_row_warnings`): reported, not failed
    warnings: list[str] = field(default_factory=list)
    note: str | None = None

    @property
    def passed(self) -> bool:
        return not self.leaks

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"passed": self.passed, "seeds": self.seeds, "times": self.times,
                               "future_rows": self.future_rows, "unknown_labels": self.unknown_labels,
                               "leaks": [dataclasses.asdict(x) for x in self.leaks[:10]], "n_leaks": len(self.leaks),
                               "warnings": list(self.warnings)}
        if self.note:
            out["note"] = self.note
        return out


def _copy(a: np.ndarray) -> np.ndarray:
    return np.array(a, copy=True)


def _pick_other(rng: np.random.Generator, n: int, idx: np.ndarray) -> np.ndarray:
    """For each of `idx` (positions among n), a random position among n different from it where n > 1."""
    if n <= 1:
        return idx.copy()
    other = rng.integers(0, n - 1, size=idx.shape[0])
    return other + (other >= idx)


class Future:
    """A copy of a database's values (what the sampler kernels read) in which the future is randomized step by step:
    `after(t)` randomizes every non-identifier cell of every row dated after `t` (by the store's `row_time`) not
    randomized yet, `labels_after(task, unknown)` the targets of the task's seeds `unknown`. Cut-offs are taken
    latest first, so each step randomizes only the rows between two cut-offs. `data` is the `SamplerData` to build
    contexts from; its caches of the graph (which no value changes) are shared with the original."""

    def __init__(self, data: SamplerData, row_time: np.ndarray, seed: int = 0):
        self.rng = np.random.default_rng([seed, 1])
        self.src = data
        self.num, self.ts, self.u32 = _copy(data.num_pool), _copy(data.ts_pool), _copy(data.u32_pool)
        self.bits, self.valid = _copy(data.bool_bits), _copy(data.valid_bits)
        time = np.asarray(row_time, np.int64)
        asc = np.argsort(time, kind="stable")  # static rows (INT64_MIN) first, NULL times (INT64_MAX) last
        self.sorted_time = time[asc]
        self.order = asc[::-1]  # latest first
        self.done = 0  # rows of `order` randomized so far
        self.labels_done: dict[str, np.ndarray] = {}
        # each task's targets as writable copies behind read-only views (what the kernels take), changed in place:
        # a sampler keeps the TaskData objects it was built with
        self.targets: dict[str, dict[str, np.ndarray]] = {}
        tasks = []
        for t in data.tasks:
            own = {name: _copy(getattr(t, name)) for name in _TARGETS}
            self.targets[t.name] = own
            tasks.append(dataclasses.replace(t, **{name: _view(a) for name, a in own.items()}))
        self.data = dataclasses.replace(
            data, num_pool=_view(self.num), ts_pool=_view(self.ts), u32_pool=_view(self.u32), bool_bits=_view(self.bits),
            valid_bits=_view(self.valid), tasks=tasks)
        self.data._segments, self.data._counts = data._segments, data._counts

    def after(self, cutoff: int) -> int:
        """Randomize the rows dated after `cutoff` not randomized yet; returns how many that was."""
        end = int(self.sorted_time.size - np.searchsorted(self.sorted_time, cutoff, side="right"))  # time > cutoff
        rows = np.sort(self.order[self.done:end])
        self.done = max(self.done, end)
        d = self.src
        tables = np.searchsorted(d.tab_row_off, rows, side="right") - 1
        for t in np.unique(tables):
            lo, hi = int(d.tab_row_off[t]), int(d.tab_row_off[t + 1])
            fut = rows[tables == t] - lo
            self._table(t, lo, hi - lo, fut)
        return int(rows.size)

    def _table(self, t: int, lo: int, n: int, fut: np.ndarray) -> None:
        d, rng = self.src, self.rng
        nb = (n + 7) // 8
        for c in d.tab_cols[d.tab_col_ptr[t]:d.tab_col_ptr[t + 1]]:
            st = SemanticType(int(d.col_stype[c]))
            if st == SemanticType.IDENTIFIER:  # keys are the structure (which rows link), not values
                continue
            src = _pick_other(rng, n, fut)
            vo = int(d.col_voff[c])
            v = np.unpackbits(self.valid[vo:vo + nb], count=n, bitorder="little")
            v[fut] = v[src]
            self.valid[vo:vo + nb] = np.packbits(v, bitorder="little")
            off = int(d.col_off[c])
            if st == SemanticType.BOOLEAN:
                b = np.unpackbits(self.bits[off:off + nb], count=n, bitorder="little")
                b[fut] = rng.integers(0, 2, size=fut.size)
                self.bits[off:off + nb] = np.packbits(b, bitorder="little")
            elif st == SemanticType.NUMERICAL:
                self.num[off + fut] = rng.normal(0.0, 2.0, size=fut.size).astype(np.float32)
            elif st == SemanticType.TIMESTAMP:
                self.ts[off + fut] = self.ts[off + src]
                self.ts[off + fut, -1] += rng.normal(0.0, 1.0, size=fut.size).astype(np.float32)
            else:  # categorical and text: another row's category / text
                self.u32[off + fut] = self.u32[off + src]

    def labels_after(self, task: str, unknown: np.ndarray) -> None:
        """The targets (value and NULL-ness) of `task`'s seeds `unknown` not randomized yet taken from random other
        seeds (a boolean's drawn at random)."""
        own = self.targets[task]
        done = self.labels_done.setdefault(task, np.zeros(unknown.shape[0], bool))
        idx = np.flatnonzero(unknown & ~done)
        done |= unknown
        n = unknown.shape[0]
        if idx.size == 0:
            return
        rng = self.rng
        src = _pick_other(rng, n, idx)
        valid = np.unpackbits(own["tgt_valid"], count=n, bitorder="little")
        valid[idx] = valid[src]
        own["tgt_valid"][:] = np.packbits(valid, bitorder="little")
        for name in ("tgt_f32", "tgt_ts", "tgt_u32"):
            if own[name].shape[0] == n:
                own[name][idx] = own[name][src]
        if own["tgt_bits"].shape[0] == (n + 7) // 8 and n > 1:
            b = np.unpackbits(own["tgt_bits"], count=n, bitorder="little")
            b[idx] = rng.integers(0, 2, size=idx.size)
            own["tgt_bits"][:] = np.packbits(b, bitorder="little")


_TARGETS = ("tgt_f32", "tgt_ts", "tgt_u32", "tgt_bits", "tgt_valid")


def _view(a: np.ndarray) -> np.ndarray:
    """A read-only view of `a` (what the kernels take); `a` itself stays writable."""
    v = a.view()
    v.flags.writeable = False
    return v


def _row_name(store: Any, data: SamplerData, row: int) -> tuple[str, str]:
    t = int(np.searchsorted(data.tab_row_off, row, side="right") - 1)
    table = data.table_names[t]
    local = int(row - data.tab_row_off[t])
    keys = store.keys(table) if hasattr(store, "keys") else None
    key = keys[local].as_py() if keys is not None else local
    return table, f"{store.table(table).primary_key or 'row'}={key}"


def _model_inputs(batch: Any) -> dict[str, np.ndarray]:
    """What the model reads of a batch: its inputs without the ground truth the loss alone reads (the target cell's
    value is blanked in them, so a seed's own label, unknown at its observation time, is no difference)."""
    from confluence.model.inputs import TARGET_FIELDS, batch_to_inputs

    return {k: np.asarray(v) for k, v in batch_to_inputs(batch).items() if k not in TARGET_FIELDS}


def _leaks(store: Any, data: SamplerData, task: str, ref: Any, pert: Any, cutoff: int,
           row_time: np.ndarray) -> list[Leak]:
    """The cells where the model's inputs of two builds of the same seeds differ, named."""
    a, b = _model_inputs(ref.batch), _model_inputs(pert.batch)
    cells = ref.batch.semantic_types.shape
    diff = np.zeros(cells, bool)
    whole = False  # a difference no cell can be blamed for (a shape, a scalar, the row graph)
    for name, x in a.items():
        y = b[name]
        if name == "text_batch_embeddings":
            continue
        if x.shape != y.shape:
            whole = True
        elif x.ndim >= 2 and x.shape[:2] == cells:
            d = x != y
            diff |= d.reshape(cells[0], cells[1], -1).any(axis=2)
        elif not np.array_equal(x, y):
            whole = True
    ta, tb = a["text_batch_embeddings"], b["text_batch_embeddings"]
    if ta.shape != tb.shape:
        whole = True
    elif not np.array_equal(ta, tb):  # the text cells whose embedding changed
        bad = (ta != tb).any(axis=1)
        ids = np.minimum(ref.batch.text_embed_ids.astype(np.int64), ta.shape[0] - 1)
        diff |= (ref.batch.semantic_types == int(SemanticType.TEXT)) & bad[ids]
    valid = ref.batch.seq_valid
    if whole and not diff.any():
        diff[np.flatnonzero(valid)[:1], 0] = True  # blame the first context's target cell: "other"
    out: list[Leak] = []
    for s, pos in zip(*np.nonzero(diff & valid[:, None]), strict=True):
        local_row = int(ref.batch.seq_row_ids[s, pos])
        row = int(ref.rows[s, local_row])
        table, key = _row_name(store, data, row)
        col = data.column_names[int(ref.batch.column_ids[s, pos])]
        if int(ref.via[s, local_row]) == VIA_LABEL:
            what = UNKNOWN_LABEL
        else:
            what = FUTURE_CELL if row_time[row] > cutoff else "other"
        a_table, a_key = _row_name(store, data, int(ref.batch.anchor_rows[s]))
        out.append(Leak(task=task, anchor=f"{a_table} {a_key}", observation_time=int(ref.batch.obs_times[s]),
                        table=table, row=key, column=col.split(".", 1)[-1], what=what))
    return out


def certify_task(store: Any, config: SamplerConfig, task: str, seed_ids: np.ndarray, *, run_seed: int = 0,
                 context: str = "test", data: SamplerData | None = None, seed: int = 0,
                 anchors: tuple[np.ndarray, np.ndarray] | None = None) -> TaskCertificate:
    """The certificate of one task on `seed_ids` (its seeds to check): each seed's context is compared with the one
    built after every row dated after its observation time and every label unknown then was randomized. Seeds are
    taken latest observation time first, so each step randomizes only the rows between two of their times. `data`:
    what the sampler under test reads (default: the store's, as evaluation builds it); the future and the labels
    are judged by the store's own times and the task's declared horizon, whatever `data` says. `anchors`: (global
    anchor rows, observation times) to check instead of seeds (`predict --anchors --certify`; `seed_ids` then
    index them)."""
    data = data or SamplerData.from_store(store)
    cert = TaskCertificate(task)
    sampler = Sampler([data], config, seed=run_seed)
    entry = sampler.entry(task)
    seed_obs = np.asarray(entry.task.obs_time, np.int64)
    obs = seed_obs if anchors is None else np.asarray(anchors[1], np.int64)
    ids = np.asarray(seed_ids, np.int64)
    real = ids[obs[ids] != NO_CUTOFF]
    if real.size == 0:
        cert.note = "no seed has an observation time (a static task): nothing is after it"
        sampler.close()
        return cert
    row_time = np.asarray(store.row_time, np.int64)
    horizon = task_horizon(store, task)
    known = label_times(seed_obs, bool(entry.task.is_derived), 0 if horizon is None else horizon, task)
    future = Future(data, row_time, seed)
    other = Sampler([future.data], config, seed=run_seed)
    target: Any = task  # the anchors re-rooted once; each sampler reads its own rows and labels for them
    if anchors is not None:
        target = sampler.anchor_task(task, np.asarray(anchors[0], np.int64), obs)
    cutoffs = np.unique(obs[real])[::-1]  # latest first: each step randomizes the rows between two cut-offs
    for cutoff in cutoffs.tolist():
        cert.future_rows += future.after(cutoff)
        unknown = known > cutoff
        future.labels_after(task, unknown)  # every label unknown now (a superset of the last step's)
        other._label_cache.clear()  # label indexes hold the labels' values: rebuilt from the randomized ones
        at = np.sort(real[obs[real] == cutoff])
        for lo in range(0, at.size, config.batch_size):
            part = at[lo:lo + config.batch_size]
            ref = sampler.build(target, part, context=context)
            pert = other.build(target, part, context=context)
            cert.leaks.extend(_leaks(store, data, task, ref, pert, cutoff, row_time))
        cert.seeds += int(at.size)
        cert.times += 1
        cert.unknown_labels = max(cert.unknown_labels, int(unknown.sum()))
    other.close()
    sampler.close()
    return cert


def certificate_digest(certs: dict[str, TaskCertificate], db_name: str) -> str:
    """sha256 of what was checked and found, for the evaluation JSON and the report."""
    body = {"database": db_name, "tasks": {k: v.summary() for k, v in sorted(certs.items())}}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def certify(store: Any, config: SamplerConfig, tasks: list[str], split: str, *, run_seed: int = 0,
            max_seeds: int = 200, progress: Any = None) -> dict[str, Any]:
    """The certificate of every task in `tasks` on `split` (at most `max_seeds` seeds each, drawn as evaluation
    draws them), with each task's same-row warnings found on its validation split: `{"passed", "digest", "tasks":
    {task: summary}}`."""
    data = SamplerData.from_store(store)
    sampler = Sampler([data], config, seed=run_seed)
    certs: dict[str, TaskCertificate] = {}
    for task in tasks:
        if progress is not None:
            progress.step(f"{task}: leakage certificate", 1)
        ids = subsample(sampler.seed_ids(split, task), max_seeds)
        certs[task] = certify_task(store, config, task, ids, run_seed=run_seed, context=split, data=data)
        val = subsample(sampler.seed_ids("val", task), 5000)
        certs[task].warnings = same_row_warnings(store, task, sampler.seed_ids("train", task), val)
        if progress is not None:
            progress.advance(1)
    sampler.close()
    return {"passed": all(c.passed for c in certs.values()), "digest": certificate_digest(certs, store.name),
            "tasks": {k: v.summary() for k, v in certs.items()}}


# ------------------------------------------------------------------------------------- what the task lets through

NEAR_PERFECT = 0.99  # a single same-row column scoring this (accuracy, AUROC) on validation is reported
NEAR_EXACT = 0.01  # ... or an error below this share of the trivial baseline's (numbers, times)


def _column_values(store: Any, table: str, col: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One column's stored values at local `rows` as float64 (a time's epoch component, a category's index, a
    boolean as 0 / 1) and their validity."""
    n = store.table(table).num_rows
    valid = np.unpackbits(np.asarray(store.validity(table, col.name)), count=n, bitorder="little").astype(bool)
    raw = np.asarray(store.values(table, col.name))
    st = SemanticType(int(col.stype))
    if st == SemanticType.BOOLEAN:
        vals = np.unpackbits(raw, count=n, bitorder="little").astype(np.float64)
    elif st == SemanticType.TIMESTAMP:
        vals = raw[:, -1].astype(np.float64)
    else:
        vals = raw.astype(np.float64)
    return vals[rows], valid[rows]


def _single_column_score(kind_: Any, categorical_col: bool, x_tr: np.ndarray, y_tr: np.ndarray, x_ev: np.ndarray,
                         y_ev: np.ndarray) -> tuple[float, float] | None:
    """(the column's headline score as a one-column predictor, the trivial baseline's) on the evaluated rows: a
    category column through its train majority class per value, a number through a least-squares line (booleans:
    the value itself as a score)."""
    metric, _ = kind_.headline
    if x_tr.size < 10 or x_ev.size < 10:
        return None
    if kind_.classifies:
        if categorical_col:
            k = int(max(y_tr.max(initial=0), y_ev.max(initial=0))) + 1
            table: dict[float, np.ndarray] = {}
            for v, y in zip(x_tr, y_tr.astype(np.int64), strict=True):
                table.setdefault(v, np.zeros(k))[y] += 1
            prior = np.bincount(y_tr.astype(np.int64), minlength=k) + 1e-3
            probs = np.stack([(table.get(v, prior) + 1e-3) / (table.get(v, prior) + 1e-3).sum() for v in x_ev])
            pred = probs if kind_.has_classes else probs[:, 1] if k > 1 else probs[:, 0]
        elif kind_.has_classes:
            return None
        else:
            pred = x_ev
    else:
        a = np.vstack([x_tr, np.ones_like(x_tr)]).T
        coef, *_ = np.linalg.lstsq(a, y_tr, rcond=None)
        pred = x_ev * coef[0] + coef[1]
    score = kind_.metrics(y_ev, pred)[metric]
    trivial = next(iter(kind_.trivial_predictions(y_tr, y_ev.size, int(y_ev.max(initial=0)) + 1
                                                  if kind_.has_classes else None).values()))
    return float(score), float(kind_.metrics(y_ev, trivial)[metric])


def same_row_warnings(store: Any, task: str, train_ids: np.ndarray, eval_ids: np.ndarray) -> list[str]:
    """The anchor table's columns (the ones a context shows of the anchor row) that alone predict the target almost
    exactly on the evaluated rows: a restated or later-known target the task's `exclude_columns` should hide. Each
    a sentence naming the column and the scores; a warning, since a column can be that good legitimately."""
    from confluence.targets import decode_targets, kind

    info = store.task(task)
    k = kind(info.target_stype)
    table = store.table(info.anchor_table)
    hidden = set(info.exclude_column_idxs) | {int(info.target_column_idx)}
    arrays = store.task_arrays(task)
    rows = np.asarray(arrays.anchor_row, np.int64) - int(table.row_offset)
    tr, ev = decode_targets(store, task, train_ids), decode_targets(store, task, eval_ids)
    out = []
    for col in table.columns:
        st = SemanticType(int(col.stype))
        if int(col.column_idx) in hidden or st in (SemanticType.IDENTIFIER, SemanticType.TEXT, SemanticType.IGNORED):
            continue
        x_tr, ok_tr = _column_values(store, table.name, col, rows[train_ids])
        x_ev, ok_ev = _column_values(store, table.name, col, rows[eval_ids])
        keep_tr, keep_ev = ok_tr & ~tr.is_null, ok_ev & ~ev.is_null
        scored = _single_column_score(k, st == SemanticType.CATEGORICAL, x_tr[keep_tr], tr.values[keep_tr],
                                      x_ev[keep_ev], ev.values[keep_ev])
        if scored is None:
            continue
        score, trivial = scored
        metric, higher = k.headline
        if metric == "auroc":
            score = max(score, 1.0 - score)  # a column that ranks the classes the other way round tells as much
        if higher:
            hit = score >= NEAR_PERFECT
        else:
            hit = trivial > 0 and score <= NEAR_EXACT * trivial
        if hit:
            out.append(f"column {table.name}.{col.name} alone predicts {task!r} almost exactly on these rows "
                       f"({metric} {score:.4g}; the trivial baseline {trivial:.4g}): if it restates the target or "
                       f"is known only after the observation time, add it to the task's exclude_columns")
    return out
